"""The virtual-time engine (`--engine sim`): the fabric a Mininet run would build, with the
same hosts, ranks and switch pipeline, driven by one event loop instead of processes."""

from common.native import install

install()  # the compiled build of the hot modules, where current (common/native.py)
