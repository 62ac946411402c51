"""Fixtures shared by the namespace tests."""

import pytest
from netns import Lab, reap_stale


@pytest.fixture
def lab(tmp_path):
    """A scratch set of network namespaces, removed whatever the test's outcome."""
    reap_stale()
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()
