"""A software FORGIVE switch that behaves like p4src/forgive.p4 and is driven over P4Runtime.

BMv2 is not packaged anywhere, so a fresh machine or CI needs a dataplane of its
own. This one reads the same P4Info, answers the same P4Runtime calls and makes
the same per-packet decisions (LPM, crc16 ECMP, trimming, RED marking, strict
priority), so the controller and the tests cannot tell which target they drive.
"""

from common.native import install

install()  # the compiled pipeline and ports, where current (common/native.py)
