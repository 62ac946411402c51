"""FORGIVE host agent: the sans-IO protocol core and the raw-socket edge that drives it."""

from common.native import install

install()  # the compiled build of the hot modules, where current (common/native.py)
