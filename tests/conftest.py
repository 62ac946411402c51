"""Fixtures shared by the namespace tests, which tests may run side by side, and when the
soak runs."""

import os

import pytest
from hypothesis import HealthCheck, settings
from native_guard import refuse_copies
from netns import Lab, reap_stale

refuse_copies()
"""Every test, on either build, refuses to copy or pickle an instance of a class the compiled
build makes native (tests/native_guard.py): the plain build would do it, the compiled one
cannot (issue 39)."""

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


SOAK_ASKED = "FORGIVE_SOAK_STEPS"
"""The environment variable that asks for the soak (its length; `make soak` sets it)."""


def pytest_collection_modifyitems(config, items):
    """`soak` tests (a run of many minutes) only when SOAK_ASKED is set, as under `make
    soak`: pyproject's default `-m 'not soak'` is lost whenever a command line gives its own
    `-m` (`pytest -m "not netns"` ran the soak)."""
    if os.environ.get(SOAK_ASKED):
        return
    soaks = [item for item in items if item.get_closest_marker("soak")]
    if soaks:
        config.hook.pytest_deselected(items=soaks)
        items[:] = [item for item in items if not item.get_closest_marker("soak")]
        config.stash[SOAKS_LEFT_OUT] = len(soaks)


SOAKS_LEFT_OUT = pytest.StashKey[int]()


def pytest_report_collectionfinish(config):
    left_out = config.stash.get(SOAKS_LEFT_OUT, 0)
    if left_out:
        return f"{left_out} soak test(s) left out: they run with {SOAK_ASKED} set (make soak)"
    return None


@pytest.fixture
def lab(tmp_path):
    """A scratch set of network namespaces, removed whatever the test's outcome."""
    reap_stale()
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()
