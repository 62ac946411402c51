"""Mininet topologies and the emulation runner."""

from common.native import install

install()  # the compiled build of the hot modules, where current (common/native.py)
