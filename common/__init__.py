"""The ground floor: facts every package shares and none may define again.

The wire format (`wire`: the FTH and its framing; `frames`: Ethernet, IPv4 and
UDP around it), the control-plane names of both P4 programs (`p4names`: v1model
and TNA) and the names of the records the hosts write and the runs read
(`records`). Every package may import this one; it imports none of them (the
layers contract in pyproject.toml holds it to that). `native` loads the compiled
build of the hot modules where it is current, before any of them is imported.
"""

from common.native import install

install()
