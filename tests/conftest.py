"""Fixtures shared by the namespace tests, and which tests may run side by side."""

import pytest
from netns import Lab, reap_stale


def pytest_itemcollected(item):
    """Under `make test` (pytest-xdist, --dist loadgroup) tests that touch the machine's
    network run in two queues, each one test at a time: `fabric` tests build an emulated
    fabric or take the machine-wide fabric lock (Mininet, `forgive clean`), whose cleanup
    would take any other fabric's ports; the other `netns` tests keep to namespaces of their
    own (tagged by pid, ports named apart from a fabric's) and so may run beside a fabric.
    The rest, which keep to themselves, fill both workers."""
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
