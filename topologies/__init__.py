"""The emulation (`--engine mininet`): a run plan's fabric built in Mininet with FORGIVE
switches (the switch model or BMv2), configured over P4Runtime, one trainer process per rank,
and everything torn down whatever happens."""
