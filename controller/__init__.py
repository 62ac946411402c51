"""P4Runtime controller for FORGIVE switches."""
