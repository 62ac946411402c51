"""An in-memory P4Runtime server holding entities the way a switch must, for
controller tests of targets this machine cannot run (Tofino).

It takes any P4Info and enforces what a P4Runtime switch enforces about the
entities the Tofino controller writes: ids from the pushed P4Info, parameter
widths, INSERT of an existing entity or MODIFY/DELETE of a missing one
refused, a group only of existing members, an indirect entry only to an
existing group, nothing deleted while something refers to it, and a batch's
updates applied in any order (they are applied in reverse), a range of every
value or a ternary mask of 0 written as an omitted field (P4Runtime's don't
care), a ternary value with bits outside its mask refused, and a table's
default entry only modified, never inserted or deleted, and read back only
with is_default_action (until one is written, nothing is read back). Errors come back
as real switches report them: gRPC UNKNOWN with one p4.v1.Error per update.
Packets and counters are out of scope; counters read back as the test sets them.
"""

from __future__ import annotations

from concurrent import futures

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc


class Refused(Exception):
    def __init__(self, code: int, message: str):
        self.code, self.message = code, message
        super().__init__(message)


def _int(value: bytes) -> int:
    return int.from_bytes(value, "big")


class Store(p4runtime_pb2_grpc.P4RuntimeServicer):
    def __init__(self) -> None:
        self.p4info: p4info_pb2.P4Info | None = None
        self.cookie: int | None = None
        self.entities: dict[tuple, p4runtime_pb2.Entity] = {}
        self.counters: dict[tuple[int, int], tuple[int, int]] = {}
        """(counter id, index) -> (packets, bytes), set by tests."""
        self.writes: list[list[tuple[int, str]]] = []
        """Per Write: (update type, entity kind) of each update, as received."""
        self.pipeline_pushes = 0

    def held(self, table: str) -> list[p4runtime_pb2.TableEntry]:
        """The entries held in the table named `table`, its default entry included."""
        (table_id,) = [t.preamble.id for t in self.p4info.tables if t.preamble.name == table]
        return [
            e.table_entry
            for k, e in self.entities.items()
            if k[0] == "table_entry" and e.table_entry.table_id == table_id
        ]

    def action_of(self, entry: p4runtime_pb2.TableEntry) -> tuple[str, dict[str, int]]:
        """An entry's action by name, with its parameters by name."""
        action_id = entry.action.action.action_id
        (action,) = [a for a in self.p4info.actions if a.preamble.id == action_id]
        names = {p.id: p.name for p in action.params}
        return action.preamble.name, {
            names[p.param_id]: _int(p.value) for p in entry.action.action.params
        }

    # -- pipeline and arbitration ------------------------------------------------

    def SetForwardingPipelineConfig(self, request, context):
        self.p4info = request.config.p4info
        self.cookie = request.config.cookie.cookie
        self.entities.clear()
        self.pipeline_pushes += 1
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request, context):
        if self.p4info is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no pipeline")
        reply = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        reply.config.cookie.cookie = self.cookie
        reply.config.p4info.CopyFrom(self.p4info)
        return reply

    def StreamChannel(self, request_iterator, context):
        for request in request_iterator:
            if request.HasField("arbitration"):
                reply = p4runtime_pb2.StreamMessageResponse()
                reply.arbitration.CopyFrom(request.arbitration)
                reply.arbitration.status.code = code_pb2.OK
                yield reply

    # -- keys and checks -----------------------------------------------------------

    def _table(self, table_id: int) -> p4info_pb2.Table:
        for table in self.p4info.tables:
            if table.preamble.id == table_id:
                return table
        raise Refused(code_pb2.NOT_FOUND, f"no table {table_id}")

    def _check_action(self, action: p4runtime_pb2.Action, allowed: set[int]) -> None:
        info = {a.preamble.id: a for a in self.p4info.actions}.get(action.action_id)
        if info is None or action.action_id not in allowed:
            raise Refused(code_pb2.INVALID_ARGUMENT, f"action {action.action_id} not allowed")
        widths = {p.id: p.bitwidth for p in info.params}
        if sorted(p.param_id for p in action.params) != sorted(widths):
            raise Refused(code_pb2.INVALID_ARGUMENT, f"wrong params for {info.preamble.name}")
        for p in action.params:
            if _int(p.value) >> widths[p.param_id]:
                raise Refused(code_pb2.OUT_OF_RANGE, f"param {p.param_id} too wide")

    def _key(self, entity: p4runtime_pb2.Entity) -> tuple:
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            e = entity.table_entry
            if e.is_default_action:
                return (kind, e.table_id, "default")
            match = []
            for m in e.match:
                which = m.WhichOneof("field_match_type")
                values = {
                    "exact": (_int(m.exact.value),),
                    "lpm": (_int(m.lpm.value), m.lpm.prefix_len),
                    "range": (_int(m.range.low), _int(m.range.high)),
                    "ternary": (_int(m.ternary.value), _int(m.ternary.mask)),
                }[which]
                match.append((m.field_id, *values))
            return (kind, e.table_id, tuple(sorted(match)), e.priority)
        if kind == "action_profile_member":
            m = entity.action_profile_member
            return (kind, m.action_profile_id, m.member_id)
        if kind == "action_profile_group":
            g = entity.action_profile_group
            return (kind, g.action_profile_id, g.group_id)
        if kind == "packet_replication_engine_entry":
            return (kind, entity.packet_replication_engine_entry.clone_session_entry.session_id)
        raise Refused(code_pb2.UNIMPLEMENTED, f"{kind} not held")

    def _check(self, entity: p4runtime_pb2.Entity) -> None:
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            e = entity.table_entry
            table = self._table(e.table_id)
            fields = {m.id: m for m in table.match_fields}
            if e.is_default_action:
                if e.match or e.priority:
                    raise Refused(code_pb2.INVALID_ARGUMENT, "a default entry has no key")
                self._check_action(e.action.action, {r.id for r in table.action_refs})
                return
            for m in e.match:
                if m.field_id not in fields:
                    raise Refused(code_pb2.INVALID_ARGUMENT, f"no match field {m.field_id}")
                if m.WhichOneof("field_match_type") == "range":
                    low, high = _int(m.range.low), _int(m.range.high)
                    top = (1 << fields[m.field_id].bitwidth) - 1
                    if low > high or high > top or (low, high) == (0, top):
                        raise Refused(code_pb2.INVALID_ARGUMENT, "bad or don't-care range")
                if m.WhichOneof("field_match_type") == "ternary":
                    value, mask = _int(m.ternary.value), _int(m.ternary.mask)
                    if mask == 0 or value & ~mask or mask >> fields[m.field_id].bitwidth:
                        raise Refused(code_pb2.INVALID_ARGUMENT, "bad or don't-care ternary")
            prioritised = (p4info_pb2.MatchField.RANGE, p4info_pb2.MatchField.TERNARY)
            needs_priority = any(f.match_type in prioritised for f in fields.values())
            if needs_priority != (e.priority > 0):
                raise Refused(
                    code_pb2.INVALID_ARGUMENT, "priority is for range and ternary tables only"
                )
            allowed = {r.id for r in table.action_refs}
            which = e.action.WhichOneof("type")
            if table.implementation_id:
                if which != "action_profile_group_id":
                    raise Refused(code_pb2.INVALID_ARGUMENT, "indirect table needs a group")
                group = (
                    "action_profile_group",
                    table.implementation_id,
                    e.action.action_profile_group_id,
                )
                if group not in self.entities:
                    raise Refused(code_pb2.NOT_FOUND, "no such group")
            elif which != "action":
                raise Refused(code_pb2.INVALID_ARGUMENT, "direct table needs an action")
            else:
                self._check_action(e.action.action, allowed)
        elif kind == "action_profile_member":
            m = entity.action_profile_member
            profile = self._profile(m.action_profile_id)
            allowed = {r.id for t in profile.table_ids for r in self._table(t).action_refs}
            self._check_action(m.action, allowed)
        elif kind == "action_profile_group":
            g = entity.action_profile_group
            profile = self._profile(g.action_profile_id)
            if profile.max_group_size and not 0 < g.max_size <= profile.max_group_size:
                raise Refused(code_pb2.INVALID_ARGUMENT, "group max_size out of range")
            for m in g.members:
                if ("action_profile_member", g.action_profile_id, m.member_id) not in self.entities:
                    raise Refused(code_pb2.NOT_FOUND, f"no member {m.member_id}")
        else:
            session = entity.packet_replication_engine_entry.clone_session_entry
            if not 0 < session.session_id < 32768 or not session.replicas:
                raise Refused(code_pb2.INVALID_ARGUMENT, "bad clone session")

    def _profile(self, profile_id: int) -> p4info_pb2.ActionProfile:
        for profile in self.p4info.action_profiles:
            if profile.preamble.id == profile_id:
                return profile
        raise Refused(code_pb2.NOT_FOUND, f"no action profile {profile_id}")

    def _referenced(self, key: tuple) -> bool:
        for entity in self.entities.values():
            if key[0] == "action_profile_member" and entity.HasField("action_profile_group"):
                g = entity.action_profile_group
                if g.action_profile_id == key[1] and any(m.member_id == key[2] for m in g.members):
                    return True
            if key[0] == "action_profile_group" and entity.HasField("table_entry"):
                action = entity.table_entry.action
                if action.WhichOneof("type") == "action_profile_group_id" and (
                    action.action_profile_group_id == key[2]
                ):
                    return True
        return False

    def _apply(self, update: p4runtime_pb2.Update) -> None:
        key = self._key(update.entity)
        if key[-1] == "default":
            if update.type != p4runtime_pb2.Update.MODIFY:
                raise Refused(code_pb2.INVALID_ARGUMENT, "a default entry is only modified")
            self._table(key[1])
            self._check(update.entity)
            stored = p4runtime_pb2.Entity()
            stored.CopyFrom(update.entity)
            self.entities[key] = stored
            return
        present = key in self.entities
        if update.type == p4runtime_pb2.Update.INSERT and present:
            raise Refused(code_pb2.ALREADY_EXISTS, f"{key} exists")
        if update.type != p4runtime_pb2.Update.INSERT and not present:
            raise Refused(code_pb2.NOT_FOUND, f"{key} missing")
        if update.type == p4runtime_pb2.Update.DELETE:
            if self._referenced(key):
                raise Refused(code_pb2.FAILED_PRECONDITION, f"{key} is in use")
            del self.entities[key]
            return
        self._check(update.entity)
        stored = p4runtime_pb2.Entity()
        stored.CopyFrom(update.entity)
        self.entities[key] = stored

    # -- RPCs --------------------------------------------------------------------

    def Write(self, request, context):
        self.writes.append([(u.type, u.entity.WhichOneof("entity")) for u in request.updates])
        errors = {}
        for i in reversed(range(len(request.updates))):
            try:
                self._apply(request.updates[i])
            except Refused as err:
                errors[i] = err
        if errors:
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="write failed")
            for i in range(len(request.updates)):
                detail = p4runtime_pb2.Error(canonical_code=code_pb2.OK)
                if i in errors:
                    detail = p4runtime_pb2.Error(
                        canonical_code=errors[i].code, message=errors[i].message
                    )
                packed = any_pb2.Any()
                packed.Pack(detail)
                status.details.append(packed)
            context.abort_with_status(_RpcStatus(status))
        return p4runtime_pb2.WriteResponse()

    def _matches(self, query: p4runtime_pb2.Entity, entity: p4runtime_pb2.Entity) -> bool:
        kind = query.WhichOneof("entity")
        if entity.WhichOneof("entity") != kind:
            return False
        if kind == "table_entry":
            return query.table_entry.table_id in (
                0,
                entity.table_entry.table_id,
            ) and query.table_entry.is_default_action == (entity.table_entry.is_default_action)
        if kind == "action_profile_member":
            return query.action_profile_member.action_profile_id in (
                0,
                entity.action_profile_member.action_profile_id,
            )
        if kind == "action_profile_group":
            return query.action_profile_group.action_profile_id in (
                0,
                entity.action_profile_group.action_profile_id,
            )
        wanted = query.packet_replication_engine_entry.clone_session_entry.session_id
        return wanted in (0, entity.packet_replication_engine_entry.clone_session_entry.session_id)

    def Read(self, request, context):
        reply = p4runtime_pb2.ReadResponse()
        for query in request.entities:
            if query.HasField("counter_entry"):
                counter_id = query.counter_entry.counter_id
                size = {c.preamble.id: c.size for c in self.p4info.counters}[counter_id]
                wanted = query.counter_entry
                indices = [wanted.index.index] if wanted.HasField("index") else range(size)
                for index in indices:
                    out = reply.entities.add().counter_entry
                    out.counter_id, out.index.index = counter_id, index
                    packets, nbytes = self.counters.get((counter_id, index), (0, 0))
                    out.data.packet_count, out.data.byte_count = packets, nbytes
                continue
            for entity in self.entities.values():
                if self._matches(query, entity):
                    reply.entities.add().CopyFrom(entity)
        yield reply


class _RpcStatus(grpc.Status):
    def __init__(self, status: status_pb2.Status):
        self.code = grpc.StatusCode.UNKNOWN
        self.details = status.message
        self.trailing_metadata = (("grpc-status-details-bin", status.SerializeToString()),)


def serve(store: Store) -> tuple[grpc.Server, str]:
    """Serve `store` on a free loopback port; returns the server and its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(store, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"
