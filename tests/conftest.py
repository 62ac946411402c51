"""Fixtures shared by the namespace tests, and which tests may run side by side."""

import pytest
from hypothesis import HealthCheck, settings
from netns import Lab, reap_stale

settings.register_profile("forgive", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("forgive")
"""Hypothesis's wall-clock checks (a 200 ms deadline per example, and a health check on slow
input generation) are timing tests: on a loaded two-core machine a worker is descheduled
for seconds, and one failed so (2.3 s to draw 4 inputs of tests/test_wire.py). The
properties are checked with the same examples; only the clock is not."""


def pytest_itemcollected(item):
    """Under `make test` (pytest-xdist, --dist loadgroup) tests that touch the machine's
    network run in two queues, each one test at a time: `fabric` tests build an emulated
    fabric or take the machine-wide fabric lock (Mininet, `forgive clean`), whose cleanup
    would take any other fabric's ports; the other `netns` tests keep to namespaces of their
    own (tagged by pid, ports named apart from a fabric's) and so may run beside a fabric.
    The rest, which keep to themselves, fill the workers."""
    if item.get_closest_marker("fabric"):
        item.add_marker(pytest.mark.xdist_group("fabric"))
    elif item.get_closest_marker("netns") or "lab" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group("netns"))


@pytest.fixture
def lab(tmp_path):
    """A scratch set of network namespaces, removed whatever the test's outcome."""
    reap_stale()
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()
