"""Table entries as P4Runtime defines them, and the lookup snapshot the dataplane reads.

Entries are validated and keyed the way P4Runtime requires (exact values, LPM
prefixes and ternary value/mask pairs as integers, so a padded and a canonical
byte string name the same entry; a ternary entry's priority is part of its key). After every Write batch the store compiles an immutable `Forwarding`
snapshot that the packet loop picks up with one attribute read, so the loop
never takes a lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from google.rpc import code_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from common import p4names
from switch_model.surface import Pipeline, SwitchTrimming, TableInfo, Thresholds


@dataclass(frozen=True, slots=True)
class NextHop:
    """An entry running `set_nhop(dmac, port)` (ipv4_lpm or ecmp_nhop)."""

    dmac: bytes
    port: int


@dataclass(frozen=True, slots=True)
class EcmpGroup:
    """An ipv4_lpm entry running `set_ecmp_group(group_id, num_members)`."""

    group_id: int
    num_members: int


@dataclass(frozen=True, slots=True)
class Drop:
    """An entry or default running `drop()`: the packet gets no egress port."""


DROP: Final = Drop()
Route = NextHop | EcmpGroup | Drop
"""What a routing table's hit (or default) runs, tagged by its action."""


LPM_CACHE_LIMIT: Final = 1 << 16

_Update = p4runtime_pb2.Update


class P4RuntimeError(Exception):
    """One failed update or request, with the canonical code P4Runtime prescribes for it."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _int(value: bytes, bitwidth: int, what: str, code: int) -> int:
    """A P4Runtime bytestring as an integer; `code` is what a bad one earns (P4Runtime gives
    match fields OUT_OF_RANGE and action parameters INVALID_ARGUMENT)."""
    if not value:
        raise P4RuntimeError(code, f"{what}: empty byte string")
    number = int.from_bytes(value, "big")
    if number >> bitwidth:
        raise P4RuntimeError(code, f"{what}: {len(value)}-byte value exceeds {bitwidth} bits")
    return number


AclRule = tuple[int, int, int, int, int, int, bool]
"""A trim_acl entry: (srcAddr value, mask, dstAddr value, mask, dscp value, mask) and whether
it runs disable_trim."""


@dataclass(frozen=True)
class Forwarding:
    """The program's tables as the packet loop applies them; replaced whole, never changed in
    place. Each method is one `table.apply()` of forgive.p4, returning what the hit (or the
    default) runs: None where that is NoAction."""

    lpm: tuple[tuple[int, dict[int, Route]], ...] = ()
    """(mask, {masked destination: route}) by decreasing prefix length."""
    lpm_default: Route = DROP
    ecmp: dict[tuple[int, int], Route] = field(default_factory=dict)
    ecmp_default: Route = DROP
    thresholds: dict[int, Thresholds | None] = field(default_factory=dict)
    """An entry of another action than set_thresholds leaves its port unmanaged too."""
    thresholds_default: Thresholds | None = None
    """None: NoAction, the port is unmanaged."""
    trimming_default: SwitchTrimming | None = None
    """switch_trimming has no key: its default entry is the table."""
    eligibility: dict[int, bool] = field(default_factory=dict)
    """trim_eligibility: DSCP -> whether the entry runs disable_trim."""
    eligibility_default: bool = False
    acl: tuple[AclRule, ...] = ()
    """trim_acl's entries, highest priority first."""
    acl_default: bool = False
    dscp: dict[int, int | None] = field(default_factory=dict)
    """trim_dscp: egress port -> the DSCP set_trim_dscp writes."""
    dscp_default: int | None = None
    trim_queue: dict[int, int | None] = field(default_factory=dict)
    """trim_queue_limit: egress port -> the high queue's bytes for trims."""
    trim_queue_default: int | None = None
    with_data: frozenset[int] = frozenset()
    """control_queue: the FTH opcodes whose entry runs queue_with_data."""
    with_data_default: bool = False
    cache: dict[int, Route] = field(default_factory=dict)

    def ecmp_nhop(self, group_id: int, member: int) -> Route:
        return self.ecmp.get((group_id, member), self.ecmp_default)

    def port_thresholds(self, port: int) -> Thresholds | None:
        return self.thresholds.get(port, self.thresholds_default)

    def switch_trimming(self) -> SwitchTrimming | None:
        return self.trimming_default

    def trim_eligibility(self, dscp: int) -> bool:
        """True when the packet's class runs disable_trim."""
        return self.eligibility.get(dscp, self.eligibility_default)

    def trim_acl(self, src: int, dst: int, dscp: int) -> bool:
        """True when the highest-priority rule matching the packet runs disable_trim."""
        for src_v, src_m, dst_v, dst_m, dscp_v, dscp_m, disables in self.acl:
            if src & src_m == src_v and dst & dst_m == dst_v and dscp & dscp_m == dscp_v:
                return disables
        return self.acl_default

    def control_queue(self, opcode: int) -> bool:
        """True when transport control of this opcode waits in the data queue."""
        return opcode in self.with_data or self.with_data_default

    def trim_dscp(self, port: int) -> int | None:
        return self.dscp.get(port, self.dscp_default)

    def trim_queue_limit(self, port: int) -> int | None:
        return self.trim_queue.get(port, self.trim_queue_default)

    def ipv4_lpm(self, dst: int) -> Route:
        hit = self.cache.get(dst)
        if hit is not None:
            return hit
        result = self.lpm_default
        for mask, prefixes in self.lpm:
            found = prefixes.get(dst & mask)
            if found is not None:
                result = found
                break
        if len(self.cache) >= LPM_CACHE_LIMIT:
            self.cache.clear()
        self.cache[dst] = result
        return result


class TableStore:
    """The entries of the program's tables, with P4Runtime's insert/modify/delete rules."""

    def __init__(self, pipe: Pipeline):
        self.pipe = pipe
        self.entries: dict[int, dict[tuple, p4runtime_pb2.TableEntry]] = {
            tid: {} for tid in pipe.tables
        }
        self.defaults: dict[int, p4runtime_pb2.TableEntry] = {
            tid: self._initial_default(t) for tid, t in pipe.tables.items()
        }
        self._scopes = {
            (t.preamble.id, ref.id): ref.scope for t in pipe.p4info.tables for ref in t.action_refs
        }

    def _initial_default(self, table: TableInfo) -> p4runtime_pb2.TableEntry:
        entry = p4runtime_pb2.TableEntry(table_id=table.id, is_default_action=True)
        if table.const_default_action_id:
            entry.action.action.action_id = table.const_default_action_id
            return entry
        drop = self.pipe.action_ids[p4names.DROP]
        no_action = self.pipe.action_ids.get(p4names.NO_ACTION)
        chosen = drop if drop in table.actions else no_action
        if chosen is not None:
            entry.action.action.action_id = chosen
        return entry

    def clone(self) -> TableStore:
        """A copy to apply an all-or-nothing batch to.

        Built through `__init__`, not `copy.copy`: compiled, this is a mypyc native class,
        and copy and pickle rebuild one by calling `__init__` with no arguments, which fails
        for a class whose `__init__` takes some (common.native: what compiled classes
        keep to)."""
        twin = TableStore(self.pipe)
        twin.entries = {tid: dict(rows) for tid, rows in self.entries.items()}
        twin.defaults = dict(self.defaults)
        return twin

    def _table(self, table_id: int) -> TableInfo:
        table = self.pipe.tables.get(table_id)
        if table is None:
            raise P4RuntimeError(code_pb2.NOT_FOUND, f"unknown table id {table_id}")
        return table

    def _key(self, table: TableInfo, entry: p4runtime_pb2.TableEntry) -> tuple:
        given = {}
        for m in entry.match:
            if m.field_id in given:
                raise P4RuntimeError(
                    code_pb2.INVALID_ARGUMENT, f"{table.name}: match field {m.field_id} twice"
                )
            given[m.field_id] = m
        known = {fid for fid, _, _ in table.key}
        if set(given) - known:
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT,
                f"{table.name}: unknown match field id(s) {sorted(set(given) - known)}",
            )
        ternary = any(kind == p4info_pb2.MatchField.TERNARY for _, kind, _ in table.key)
        if ternary and entry.priority <= 0:
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT, f"{table.name}: a ternary entry needs a priority > 0"
            )
        if not ternary and entry.priority:
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT, f"{table.name}: priority must be 0 for exact/LPM keys"
            )
        key: list = []
        for fid, match_type, width in table.key:
            m = given.get(fid)
            what = f"{table.name} field {fid}"
            if match_type == p4info_pb2.MatchField.EXACT:
                if m is None or not m.HasField("exact"):
                    raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, f"{what}: exact value missing")
                key.append(_int(m.exact.value, width, what, code_pb2.OUT_OF_RANGE))
                continue
            if m is None:
                key.append((0, 0))
                continue
            if match_type == p4info_pb2.MatchField.TERNARY:
                key.append(self._ternary(m, width, what))
                continue
            if not m.HasField("lpm"):
                raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, f"{what}: expected an LPM match")
            plen = m.lpm.prefix_len
            if not 0 < plen <= width:
                raise P4RuntimeError(
                    code_pb2.INVALID_ARGUMENT,
                    f"{what}: prefix length {plen} outside 1..{width} (omit the field for /0)",
                )
            value = _int(m.lpm.value, width, what, code_pb2.OUT_OF_RANGE)
            if value & ((1 << (width - plen)) - 1):
                raise P4RuntimeError(
                    code_pb2.INVALID_ARGUMENT, f"{what}: bits set beyond the /{plen} prefix"
                )
            key.append((value, plen))
        if ternary:
            key.append(entry.priority)
        return tuple(key)

    @staticmethod
    def _ternary(m: p4runtime_pb2.FieldMatch, width: int, what: str) -> tuple[int, int]:
        """(value, mask) of a ternary match; P4Runtime writes "don't care" by leaving the
        field out, so a zero mask, or a value with bits outside its mask, is refused."""
        if not m.HasField("ternary"):
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, f"{what}: expected a ternary match")
        value = _int(m.ternary.value, width, what, code_pb2.OUT_OF_RANGE)
        mask = _int(m.ternary.mask, width, what, code_pb2.OUT_OF_RANGE)
        if not mask:
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT, f"{what}: mask 0 (omit the field for don't care)"
            )
        if value & ~mask:
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, f"{what}: value bits outside the mask")
        return value, mask

    def _check_action(
        self, table: TableInfo, entry: p4runtime_pb2.TableEntry, default: bool
    ) -> None:
        if entry.action.WhichOneof("type") != "action":
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT, f"{table.name}: entry needs a direct action"
            )
        action = entry.action.action
        info = self.pipe.actions.get(action.action_id)
        if info is None:
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, f"unknown action id {action.action_id}")
        if action.action_id not in table.actions:
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT, f"action {info.name} is not an action of {table.name}"
            )
        scope = self._scopes.get((table.id, action.action_id))
        wrong = p4info_pb2.ActionRef.TABLE_ONLY if default else p4info_pb2.ActionRef.DEFAULT_ONLY
        if scope == wrong:
            raise P4RuntimeError(
                code_pb2.PERMISSION_DENIED, f"action {info.name} not allowed here in {table.name}"
            )
        widths = dict(info.params)
        seen = set()
        for param in action.params:
            if param.param_id not in widths or param.param_id in seen:
                raise P4RuntimeError(
                    code_pb2.INVALID_ARGUMENT,
                    f"action {info.name}: unknown or repeated param id {param.param_id}",
                )
            seen.add(param.param_id)
            _int(
                param.value,
                widths[param.param_id],
                f"action {info.name} param {param.param_id}",
                code_pb2.INVALID_ARGUMENT,
            )
        if seen != set(widths):
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT,
                f"action {info.name}: params {sorted(set(widths) - seen)} missing",
            )

    def apply(self, update: p4runtime_pb2.Update) -> None:
        """Apply one table-entry update or raise P4RuntimeError; the store is unchanged on error."""
        entry = update.entity.table_entry
        table = self._table(entry.table_id)
        if entry.is_const:
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT, f"{table.name}: a client cannot write a const entry"
            )
        if entry.is_default_action:
            if update.type != _Update.MODIFY:
                raise P4RuntimeError(
                    code_pb2.INVALID_ARGUMENT, f"{table.name}: default entry can only be modified"
                )
            if entry.match:
                raise P4RuntimeError(
                    code_pb2.INVALID_ARGUMENT, f"{table.name}: default entry has no match"
                )
            if table.const_default_action_id:
                raise P4RuntimeError(
                    code_pb2.PERMISSION_DENIED, f"{table.name}: default action is const"
                )
            stored = p4runtime_pb2.TableEntry(table_id=table.id, is_default_action=True)
            if entry.HasField("action"):
                self._check_action(table, entry, default=True)
                stored.action.CopyFrom(entry.action)
                self.defaults[table.id] = stored
            else:
                self.defaults[table.id] = self._initial_default(table)
            return
        if not table.key:
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT, f"{table.name} has no key: only its default entry"
            )
        key = self._key(table, entry)
        rows = self.entries[table.id]
        if update.type == _Update.INSERT:
            if key in rows:
                raise P4RuntimeError(code_pb2.ALREADY_EXISTS, f"{table.name}: entry exists")
            if table.size and len(rows) >= table.size:
                raise P4RuntimeError(code_pb2.RESOURCE_EXHAUSTED, f"{table.name} is full")
            self._check_action(table, entry, default=False)
        elif update.type == _Update.MODIFY:
            if key not in rows:
                raise P4RuntimeError(code_pb2.NOT_FOUND, f"{table.name}: no such entry")
            self._check_action(table, entry, default=False)
        elif update.type == _Update.DELETE:
            if key not in rows:
                raise P4RuntimeError(code_pb2.NOT_FOUND, f"{table.name}: no such entry")
            del rows[key]
            return
        else:
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, "update type unspecified")
        stored = p4runtime_pb2.TableEntry()
        stored.CopyFrom(entry)
        rows[key] = stored

    def read(self, query: p4runtime_pb2.TableEntry) -> Iterator[p4runtime_pb2.TableEntry]:
        """Entries matching a Read request's table entry (table id 0 and no match are wildcards)."""
        if query.table_id == 0:
            for rows in self.entries.values():
                yield from rows.values()
            return
        table = self._table(query.table_id)
        if query.is_default_action:
            yield self.defaults[table.id]
        elif query.match:
            found = self.entries[table.id].get(self._key(table, query))
            if found is not None:
                yield found
        else:
            yield from self.entries[table.id].values()

    def _params(self, entry: p4runtime_pb2.TableEntry) -> tuple[str, list[int]]:
        action = entry.action.action
        info = self.pipe.actions[action.action_id]
        values = {p.param_id: int.from_bytes(p.value, "big") for p in action.params}
        return info.name, [values[pid] for pid, _ in info.params]

    def _route(self, entry: p4runtime_pb2.TableEntry) -> Route:
        name, args = self._params(entry)
        if name == p4names.SET_NHOP:
            return NextHop(args[0].to_bytes(6, "big"), args[1])
        if name == p4names.SET_ECMP_GROUP:
            return EcmpGroup(args[0], args[1])
        return DROP

    def _runs(self, entry: p4runtime_pb2.TableEntry, action: str) -> list[int] | None:
        """The parameters of `action` if the entry runs it, else None (NoAction)."""
        name, args = self._params(entry) if entry.action.action.action_id else ("", [])
        return args if name == action else None

    def _thresholds(self, entry: p4runtime_pb2.TableEntry) -> Thresholds | None:
        args = self._runs(entry, p4names.SET_THRESHOLDS)
        return None if args is None else Thresholds(*args)

    def _trimming(self, entry: p4runtime_pb2.TableEntry) -> SwitchTrimming | None:
        args = self._runs(entry, p4names.SET_SWITCH_TRIMMING)
        return None if args is None else SwitchTrimming(*args)

    def _disables(self, entry: p4runtime_pb2.TableEntry) -> bool:
        return self._runs(entry, p4names.DISABLE_TRIM) is not None

    def _with_data(self, entry: p4runtime_pb2.TableEntry) -> bool:
        return self._runs(entry, p4names.QUEUE_WITH_DATA) is not None

    def _one(self, entry: p4runtime_pb2.TableEntry, action: str) -> int | None:
        """The one parameter of `action` if the entry runs it."""
        args = self._runs(entry, action)
        return None if args is None else args[0]

    def _per_port(self, table: str, action: str) -> tuple[dict[int, int | None], int | None]:
        """A table keyed by egress port whose action has one parameter: entries and default."""
        tid = self.pipe.table_ids[table]
        rows = {key[0]: self._one(e, action) for key, e in self.entries[tid].items()}
        return rows, self._one(self.defaults[tid], action)

    def compile(self) -> Forwarding:
        ids = self.pipe.table_ids
        by_len: dict[int, dict[int, Route]] = {}
        for ((value, plen),), entry in self.entries[ids[p4names.LPM_TABLE]].items():
            by_len.setdefault(plen, {})[value] = self._route(entry)
        lpm = tuple(
            (((1 << 32) - 1) ^ ((1 << (32 - plen)) - 1), by_len[plen])
            for plen in sorted(by_len, reverse=True)
        )
        ecmp_id, th_id = ids[p4names.ECMP_TABLE], ids[p4names.THRESHOLD_TABLE]
        class_id, acl_id = ids[p4names.TRIM_ELIGIBILITY_TABLE], ids[p4names.TRIM_ACL_TABLE]
        acl = sorted(self.entries[acl_id].items(), key=lambda item: -item[0][-1])
        dscp, dscp_default = self._per_port(p4names.TRIM_DSCP_TABLE, p4names.SET_TRIM_DSCP)
        queue, queue_default = self._per_port(
            p4names.TRIM_QUEUE_TABLE, p4names.SET_TRIM_QUEUE_BYTES
        )
        control_id = ids[p4names.CONTROL_QUEUE_TABLE]
        return Forwarding(
            lpm=lpm,
            lpm_default=self._route(self.defaults[ids[p4names.LPM_TABLE]]),
            ecmp={key: self._route(e) for key, e in self.entries[ecmp_id].items()},
            ecmp_default=self._route(self.defaults[ecmp_id]),
            thresholds={key[0]: self._thresholds(e) for key, e in self.entries[th_id].items()},
            thresholds_default=self._thresholds(self.defaults[th_id]),
            trimming_default=self._trimming(self.defaults[ids[p4names.SWITCH_TRIMMING_TABLE]]),
            eligibility={key[0]: self._disables(e) for key, e in self.entries[class_id].items()},
            eligibility_default=self._disables(self.defaults[class_id]),
            acl=tuple(
                (*src, *dst, *dscp_match, self._disables(e)) for (src, dst, dscp_match, _), e in acl
            ),
            acl_default=self._disables(self.defaults[acl_id]),
            dscp=dscp,
            dscp_default=dscp_default,
            trim_queue=queue,
            trim_queue_default=queue_default,
            with_data=frozenset(
                key[0] for key, e in self.entries[control_id].items() if self._with_data(e)
            ),
            with_data_default=self._with_data(self.defaults[control_id]),
        )
