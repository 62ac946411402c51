"""Fixtures shared by the namespace tests, and which tests may run side by side."""

import pytest
from netns import Lab, reap_stale


def pytest_itemcollected(item):
    """Under `make test` (pytest-xdist, --dist loadgroup) tests that touch the machine's
    network (namespaces, veths, Mininet, paced switch queues, emulated timing) run one
    after another on one worker; the rest, which keep to themselves, run on the others."""
    if item.get_closest_marker("netns") or "lab" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group("network"))


@pytest.fixture
def lab(tmp_path):
    """A scratch set of network namespaces, removed whatever the test's outcome."""
    reap_stale()
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()
