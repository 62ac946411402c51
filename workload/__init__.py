"""An emulated data-parallel training workload that drives FORGIVE host agents."""
