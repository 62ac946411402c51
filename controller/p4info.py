"""Names to ids for one P4Info, and table entries built from names and integers.

Every id a client sends comes from the P4Info it pushed, looked up by the
names of the control surface (`switch_model/surface.py`, described in
docs/dataplane.md); a name the P4Info lacks is a ConfigError before anything
is written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2


class ConfigError(ValueError):
    """A configuration the controller refuses before touching any switch."""


def load_p4info(path: str | Path) -> p4info_pb2.P4Info:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read P4Info {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"P4Info {path} is not a text P4Info: {err}") from None
    try:
        return text_format.Parse(text, p4info_pb2.P4Info())
    except text_format.ParseError as err:
        raise ConfigError(f"P4Info {path} is not a text P4Info: {err}") from None


def encode(value: int, bitwidth: int) -> bytes:
    """P4Runtime's canonical byte string: big-endian, no leading zero bytes."""
    if value < 0 or value >> bitwidth:
        raise ConfigError(f"value {value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def entry_key(entry: p4runtime_pb2.TableEntry) -> tuple:
    """An entry's identity independent of how its byte strings were padded."""
    fields = []
    for m in entry.match:
        kind = m.WhichOneof("field_match_type")
        if kind == "exact":
            fields.append((m.field_id, int.from_bytes(m.exact.value, "big"), -1))
        elif kind == "lpm":
            fields.append((m.field_id, int.from_bytes(m.lpm.value, "big"), m.lpm.prefix_len))
        elif kind == "range":
            low, high = (int.from_bytes(v, "big") for v in (m.range.low, m.range.high))
            fields.append((m.field_id, low, high))
        elif kind == "ternary":
            value, mask = (int.from_bytes(v, "big") for v in (m.ternary.value, m.ternary.mask))
            fields.append((m.field_id, value, mask))
    return (entry.table_id, tuple(sorted(fields)), entry.priority)


def entry_action(entry: p4runtime_pb2.TableEntry) -> tuple:
    action = entry.action.action
    params = sorted((p.param_id, int.from_bytes(p.value, "big")) for p in action.params)
    return (action.action_id, tuple(params))


class P4InfoIndex:
    def __init__(self, p4info: p4info_pb2.P4Info):
        self.p4info = p4info
        self.tables = {t.preamble.name: t for t in p4info.tables}
        self.actions = {a.preamble.name: a for a in p4info.actions}
        self.counters = {c.preamble.name: c for c in p4info.counters}
        self.counter_names = {c.preamble.id: c.preamble.name for c in p4info.counters}

    def _find(self, kind: str, names: dict, name: str):
        if name not in names:
            raise ConfigError(f"P4Info has no {kind} {name}")
        return names[name]

    def check_capacity(self, switch: str, entries: Iterable[p4runtime_pb2.TableEntry]) -> None:
        """Refuse, before anything is written, a switch whose entries overflow a table: the
        P4Info gives each table's size, and a switch refuses the entries beyond it only after
        writing those before (ConfigError naming the switch and the table)."""
        counts = Counter(e.table_id for e in entries if not e.is_default_action)
        for table in self.p4info.tables:
            wanted, size = counts.get(table.preamble.id, 0), table.size
            if size and wanted > size:
                raise ConfigError(
                    f"switch {switch}: table {table.preamble.name} holds {size} entries, the "
                    f"fabric needs {wanted} there"
                )

    def table_id(self, name: str) -> int:
        return self._find("table", self.tables, name).preamble.id

    def counter(self, name: str) -> p4info_pb2.Counter:
        return self._find("counter", self.counters, name)

    def default_entry(
        self, table: str, action: str, params: dict | None = None
    ) -> p4runtime_pb2.TableEntry:
        """The default entry of `table`, running `action` (which may be NoAction)."""
        entry = p4runtime_pb2.TableEntry(table_id=self.table_id(table), is_default_action=True)
        entry.action.action.CopyFrom(self.action(action, params or {}))
        return entry

    def action(self, name: str, params: dict) -> p4runtime_pb2.Action:
        """An action with its parameters, from names and integers."""
        act = self._find("action", self.actions, name)
        result = p4runtime_pb2.Action(action_id=act.preamble.id)
        declared = {p.name: p for p in act.params}
        if set(params) != set(declared):
            raise ConfigError(f"action {name} takes {sorted(declared)}, given {sorted(params)}")
        for param_name, value in params.items():
            param = declared[param_name]
            result.params.add(param_id=param.id, value=encode(value, param.bitwidth))
        return result

    def table_entry(
        self,
        table: str,
        match: dict[str, int | tuple[int, int]],
        action: str | None,
        params: dict,
        priority: int = 0,
    ) -> p4runtime_pb2.TableEntry:
        """An entry from names: exact fields map to ints, LPM fields to (value, prefix
        length), range fields to (low, high), ternary fields to (value, mask); a range of
        every value and a ternary mask of 0 are left out, as P4Runtime writes "don't care".
        With no action the caller sets one (an action profile's member or group)."""
        info = self._find("table", self.tables, table)
        entry = p4runtime_pb2.TableEntry(table_id=info.preamble.id, priority=priority)
        fields = {m.name: m for m in info.match_fields}
        for name, value in match.items():
            field = self._find(f"match field of {table}", fields, name)
            kind = field.match_type
            if kind == p4info_pb2.MatchField.RANGE and tuple(value) == (
                0,
                (1 << field.bitwidth) - 1,
            ):
                continue
            if kind == p4info_pb2.MatchField.TERNARY and value[1] == 0:
                continue
            m = entry.match.add(field_id=field.id)
            if kind == p4info_pb2.MatchField.LPM:
                m.lpm.value = encode(value[0], field.bitwidth)
                m.lpm.prefix_len = value[1]
            elif kind == p4info_pb2.MatchField.RANGE:
                m.range.low = encode(value[0], field.bitwidth)
                m.range.high = encode(value[1], field.bitwidth)
            elif kind == p4info_pb2.MatchField.TERNARY:
                m.ternary.value = encode(value[0], field.bitwidth)
                m.ternary.mask = encode(value[1], field.bitwidth)
            else:
                m.exact.value = encode(value, field.bitwidth)
        if action is not None:
            entry.action.action.CopyFrom(self.action(action, params))
        return entry
