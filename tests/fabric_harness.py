"""What the tests of an emulated fabric share: the command they run and the marks of a
Mininet run.

Kept apart from switch_harness (veths and switch processes these tests do not use), so that a
fabric test imports only the standard library and pytest from here."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

FORGIVE = [sys.executable, "-m", "commands.forgive"]
"""`forgive` from this checkout, in this interpreter (the tests run it as a user would)."""

MININET = [
    pytest.mark.netns,
    pytest.mark.fabric,
    pytest.mark.skipif(os.geteuid() != 0, reason="Mininet needs root"),
    pytest.mark.skipif(shutil.which("mnexec") is None, reason="Debian's mininet is not installed"),
]
"""The marks of a test that runs `forgive` on a Mininet fabric: one such test at a time
(tests/conftest.py), skipped, with the reason, where Mininet cannot run."""
