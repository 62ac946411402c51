"""The simulator's error, apart from the engine: `simulator.engine` is compiled (common/native.py),
and a compiled class cannot derive from RuntimeError."""

from __future__ import annotations


class SimulationError(RuntimeError):
    """A simulated run that cannot be built or did not end; the message is one line."""
