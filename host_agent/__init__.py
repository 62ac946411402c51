"""FORGIVE host agent: the sans-IO protocol core and the raw-socket edge that drives it."""
