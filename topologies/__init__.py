"""Mininet topologies and the emulation runner."""
