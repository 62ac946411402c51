"""The model's P4Runtime service: pipeline config, arbitration, Write and Read.

Error reporting follows the P4Runtime specification: a Write whose updates
fail returns gRPC UNKNOWN with a google.rpc.Status in the
`grpc-status-details-bin` trailer holding one p4.v1.Error per update, in
order, OK for those that succeeded; every other RPC fails with the canonical
code itself. gRPC clients drop a response whose metadata passes 8 KiB
("Stream removed"), so messages are clipped and a batch whose list would not
fit in DETAILS_BUDGET lists only its first updates, its status message
naming the first failure and counting the failures left out.

grpcio's synchronous server holds one worker thread per open StreamChannel for
the stream's whole life, so streams get MAX_STREAMS threads of their own, the
pool keeps UNARY_WORKERS more that no stream can take, and a stream beyond
MAX_STREAMS is refused with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from common.tls import ServerTls
from switch_model import surface
from switch_model.dataplane import Dataplane
from switch_model.surface import PipelineMismatch, load_pipeline
from switch_model.tables import P4RuntimeError, TableStore

API_VERSION = "1.4.1"
MAX_STREAMS = 16
"""StreamChannels open at once (BMv2's PI server also takes 16 controllers per device)."""
UNARY_WORKERS = 8
"""Worker threads beyond the streams' share, so unary calls always find one."""
DETAILS_BUDGET = 4096
"""Bytes of per-update details a failed Write carries, half of gRPC's default 8 KiB metadata limit."""
UPDATE_MESSAGE_CHARS = 240
"""Characters of one update's error message."""
STATUS_MESSAGE_CHARS = 2048
"""Characters of an RPC's status message."""
log = logging.getLogger(__name__)

_Set = p4runtime_pb2.SetForwardingPipelineConfigRequest
_Get = p4runtime_pb2.GetForwardingPipelineConfigRequest
_Atomicity = p4runtime_pb2.WriteRequest


def _grpc_code(code: int) -> grpc.StatusCode:
    return {c.value[0]: c for c in grpc.StatusCode}[code]


class Arbitration:
    """Who is primary, by P4Runtime's rule: the stream holding the highest election id the
    server has seen since it started, even if that stream has gone. A stream without an
    election id is a backup for good; once the primary leaves, nobody is primary until a
    stream claims an id at least as high."""

    def __init__(self):
        self.streams: dict[int, tuple[int | None, queue.Queue]] = {}
        self.highest: int | None = None
        self.lock = threading.Lock()

    def _primary(self) -> int | None:
        if self.highest is None:
            return None
        return next((s for s, (eid, _) in self.streams.items() if eid == self.highest), None)

    def join(self, stream: int, election_id: int | None, outbox: queue.Queue) -> None:
        """A stream's (first or later) arbitration update; tells whoever the change concerns."""
        with self.lock:
            if election_id is not None and any(
                other != stream and eid == election_id for other, (eid, _) in self.streams.items()
            ):
                raise P4RuntimeError(
                    code_pb2.INVALID_ARGUMENT, f"election id {election_id} already in use"
                )
            before = self._primary()
            self.streams[stream] = (election_id, outbox)
            if election_id is not None and (self.highest is None or election_id >= self.highest):
                self.highest = election_id
            after = self._primary()
            self._announce(self.streams if stream in (before, after) else [stream])

    def leave(self, stream: int) -> None:
        with self.lock:
            was_primary = self._primary() == stream
            if self.streams.pop(stream, None) is not None and was_primary:
                self._announce(self.streams)

    def _announce(self, streams) -> None:
        primary = self._primary()
        for stream in streams:
            if stream == primary:
                code = code_pb2.OK
            else:
                code = code_pb2.ALREADY_EXISTS if primary is not None else code_pb2.NOT_FOUND
            self.streams[stream][1].put((code, self.highest))

    def check_primary(self, election_id: int | None) -> None:
        with self.lock:
            if self._primary() is None or election_id != self.highest:
                raise P4RuntimeError(
                    code_pb2.PERMISSION_DENIED, f"election id {election_id} is not the primary"
                )


def _uint128(value) -> int:
    return (value.high << 64) | value.low


def _election(message) -> int | None:
    """A request's election id; None when unset, which P4Runtime ranks below every id."""
    return _uint128(message.election_id) if message.HasField("election_id") else None


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit - 30]}... ({len(text) - limit + 30} more characters)"


def _bmv2_list(value, where: str) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise P4RuntimeError(
            code_pb2.INVALID_ARGUMENT, f"device config: {where} is not a list of objects"
        )
    return value


def _names(items: list[dict]) -> set[str]:
    return {item["name"] for item in items if isinstance(item.get("name"), str)}


def check_device_config(data: bytes, pipe: surface.Pipeline) -> None:
    """Refuse a device config that is not BMv2 JSON of the program the P4Info describes.

    The model runs forgive.p4 itself and never reads the config, but it takes only what
    BMv2 would be given, so a fabric configured against the model works on BMv2 too."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise P4RuntimeError(
            code_pb2.INVALID_ARGUMENT, "device config is not JSON (expected forgive.p4's BMv2 JSON)"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("__meta__"), dict):
        raise P4RuntimeError(
            code_pb2.INVALID_ARGUMENT, "device config is not BMv2 JSON (no __meta__ object)"
        )
    pipelines = _bmv2_list(doc.get("pipelines"), "pipelines")
    declared = {
        "table": {
            name for p in pipelines for name in _names(_bmv2_list(p.get("tables"), "tables"))
        },
        "action": _names(_bmv2_list(doc.get("actions"), "actions")),
        "counter": _names(_bmv2_list(doc.get("counter_arrays"), "counter_arrays")),
    }
    missing = [
        f"{kind} {name}"
        for kind, names in (
            ("table", pipe.table_ids),
            ("action", pipe.action_ids),
            ("counter", pipe.counter_ids),
        )
        for name in sorted(names)
        if name not in declared[kind]
    ]
    if missing:
        raise P4RuntimeError(
            code_pb2.INVALID_ARGUMENT,
            f"device config is not the P4Info's program: it lacks {', '.join(missing)}",
        )


class SwitchService(p4runtime_pb2_grpc.P4RuntimeServicer):
    def __init__(self, device_id: int, dataplane: Dataplane):
        self.device_id = device_id
        self.dataplane = dataplane
        self.arbitration = Arbitration()
        self.lock = threading.RLock()
        self.config: p4runtime_pb2.ForwardingPipelineConfig | None = None
        self.saved: tuple[p4runtime_pb2.ForwardingPipelineConfig, surface.Pipeline] | None = None
        self.store: TableStore | None = None
        self._stream_ids = iter(range(1, 1 << 62))
        self._open_streams: set[int] = set()
        self._streams_lock = threading.Lock()

    # -- helpers -----------------------------------------------------------------

    def _check_device(self, device_id: int) -> None:
        if device_id != self.device_id:
            raise P4RuntimeError(code_pb2.NOT_FOUND, f"no device {device_id}")

    def _require_pipeline(self) -> TableStore:
        if self.store is None:
            raise P4RuntimeError(code_pb2.FAILED_PRECONDITION, "no forwarding pipeline set")
        return self.store

    @staticmethod
    def _abort(context: grpc.ServicerContext, err: P4RuntimeError):
        context.abort(_grpc_code(err.code), _clip(err.message, STATUS_MESSAGE_CHARS))

    # -- pipeline --------------------------------------------------------------------

    def SetForwardingPipelineConfig(self, request, context):
        try:
            self._check_device(request.device_id)
            self.arbitration.check_primary(_election(request))
            with self.lock:
                self._set_pipeline(request)
        except P4RuntimeError as err:
            self._abort(context, err)
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _set_pipeline(self, request) -> None:
        if request.action == _Set.COMMIT:
            if request.HasField("config"):
                raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, "COMMIT takes no config")
            if self.saved is None:
                raise P4RuntimeError(code_pb2.NOT_FOUND, "no saved pipeline to commit")
            self._commit(*self.saved)
            self.saved = None
            return
        if request.action not in (_Set.VERIFY, _Set.VERIFY_AND_SAVE, _Set.VERIFY_AND_COMMIT):
            raise P4RuntimeError(
                code_pb2.UNIMPLEMENTED, f"pipeline action {_Set.Action.Name(request.action)}"
            )
        if not request.HasField("config"):
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, "request has no config")
        try:
            pipe = load_pipeline(request.config.p4info)
        except PipelineMismatch as err:
            raise P4RuntimeError(
                code_pb2.INVALID_ARGUMENT, f"P4Info not implemented by the switch model: {err}"
            ) from None
        check_device_config(request.config.p4_device_config, pipe)
        if request.action == _Set.VERIFY_AND_SAVE:
            self.saved = (request.config, pipe)
        elif request.action == _Set.VERIFY_AND_COMMIT:
            self._commit(request.config, pipe)

    def _commit(self, config, pipe: surface.Pipeline) -> None:
        self.config = p4runtime_pb2.ForwardingPipelineConfig()
        self.config.CopyFrom(config)
        self.store = TableStore(pipe)
        self.dataplane.pipeline.forwarding = self.store.compile()
        self.dataplane.counters.clear()
        log.info("pipeline committed: %d tables, %d counters", len(pipe.tables), len(pipe.counters))

    def GetForwardingPipelineConfig(self, request, context):
        try:
            self._check_device(request.device_id)
        except P4RuntimeError as err:
            self._abort(context, err)
        response = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        with self.lock:
            if self.config is None:
                self._abort(
                    context,
                    P4RuntimeError(
                        code_pb2.FAILED_PRECONDITION, "no forwarding pipeline config set"
                    ),
                )
            kind = request.response_type
            if kind in (_Get.ALL, _Get.P4INFO_AND_COOKIE):
                response.config.p4info.CopyFrom(self.config.p4info)
            if kind in (_Get.ALL, _Get.DEVICE_CONFIG_AND_COOKIE):
                response.config.p4_device_config = self.config.p4_device_config
            if self.config.HasField("cookie"):
                response.config.cookie.CopyFrom(self.config.cookie)
        return response

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # -- arbitration -----------------------------------------------------------------

    def StreamChannel(self, request_iterator, context) -> Iterator:
        stream = next(self._stream_ids)
        with self._streams_lock:
            if len(self._open_streams) >= MAX_STREAMS:
                self._abort(
                    context,
                    P4RuntimeError(
                        code_pb2.RESOURCE_EXHAUSTED, f"{MAX_STREAMS} streams already open"
                    ),
                )
            self._open_streams.add(stream)
        outbox: queue.Queue = queue.Queue()
        state = {"device": None}

        def reader():
            try:
                for message in request_iterator:
                    if message.HasField("arbitration"):
                        self._arbitrate(stream, message.arbitration, outbox, state)
                    elif message.HasField("packet"):
                        outbox.put(
                            P4RuntimeError(code_pb2.UNIMPLEMENTED, "packet-out is not supported")
                        )
            except grpc.RpcError:
                pass
            except P4RuntimeError as err:
                outbox.put(err)
            finally:
                outbox.put(None)

        context.add_callback(lambda: self._close_stream(stream))
        threading.Thread(target=reader, name=f"stream-{stream}", daemon=True).start()
        try:
            while True:
                item = outbox.get()
                if item is None:
                    return
                if isinstance(item, P4RuntimeError):
                    self._abort(context, item)
                code, highest = item
                update = p4runtime_pb2.MasterArbitrationUpdate(device_id=state["device"])
                if highest is not None:
                    update.election_id.high = highest >> 64
                    update.election_id.low = highest & ((1 << 64) - 1)
                update.status.code = code
                update.status.message = {
                    code_pb2.OK: "primary",
                    code_pb2.ALREADY_EXISTS: "another controller is primary",
                    code_pb2.NOT_FOUND: "no controller is primary",
                }[code]
                yield p4runtime_pb2.StreamMessageResponse(arbitration=update)
        finally:
            self._close_stream(stream)

    def _close_stream(self, stream: int) -> None:
        """Free a stream's slot and arbitration; called on return and on gRPC's termination."""
        self.arbitration.leave(stream)
        with self._streams_lock:
            self._open_streams.discard(stream)

    def _arbitrate(self, stream: int, update, outbox: queue.Queue, state: dict) -> None:
        if state["device"] is not None and update.device_id != state["device"]:
            raise P4RuntimeError(
                code_pb2.FAILED_PRECONDITION, f"stream is for device {state['device']}"
            )
        self._check_device(update.device_id)
        if update.HasField("role") and update.role.name:
            raise P4RuntimeError(code_pb2.UNIMPLEMENTED, "roles are not supported")
        state["device"] = update.device_id
        self.arbitration.join(stream, _election(update), outbox)

    # -- write -----------------------------------------------------------------------

    def Write(self, request, context):
        try:
            self._check_device(request.device_id)
            self.arbitration.check_primary(_election(request))
        except P4RuntimeError as err:
            self._abort(context, err)
        with self.lock:
            try:
                store = self._require_pipeline()
            except P4RuntimeError as err:
                self._abort(context, err)
            atomic = request.atomicity != _Atomicity.CONTINUE_ON_ERROR
            work = store.clone() if atomic else store
            results = [self._apply(work, update) for update in request.updates]
            failed = any(r is not None for r in results)
            if atomic and failed:
                results = [
                    r or P4RuntimeError(code_pb2.ABORTED, "batch rolled back") for r in results
                ]
            elif atomic:
                self.store = work
            self.dataplane.pipeline.forwarding = self.store.compile()
        if failed:
            self._abort_batch(context, results)
        return p4runtime_pb2.WriteResponse()

    def _apply(self, store: TableStore, update) -> P4RuntimeError | None:
        try:
            which = update.entity.WhichOneof("entity")
            if which == "table_entry":
                store.apply(update)
            elif which == "counter_entry":
                self._write_counter(store, update)
            else:
                raise P4RuntimeError(code_pb2.UNIMPLEMENTED, f"writing {which} is not supported")
        except P4RuntimeError as err:
            return err
        return None

    @staticmethod
    def _abort_batch(context, results: list[P4RuntimeError | None]) -> None:
        status = status_pb2.Status(code=code_pb2.UNKNOWN)
        size = 0
        for result in results:
            error = p4runtime_pb2.Error(canonical_code=code_pb2.OK)
            if result is not None:
                error.canonical_code = result.code
                error.message = _clip(result.message, UPDATE_MESSAGE_CHARS)
            packed = any_pb2.Any()
            packed.Pack(error)
            size += packed.ByteSize() + 4  # the field's tag and length
            if size > DETAILS_BUDGET:
                break
            status.details.append(packed)
        failures = [(i, r) for i, r in enumerate(results) if r is not None]
        index, first = failures[0]
        status.message = (
            f"{len(failures)} of {len(results)} updates failed; first: update {index}: "
            f"{code_pb2.Code.Name(first.code)} {_clip(first.message, UPDATE_MESSAGE_CHARS)}"
        )
        covered = len(status.details)
        left_out = sum(1 for r in results[covered:] if r is not None)
        if left_out:
            status.message += (
                f"; details list updates 0..{covered - 1} only, {left_out} "
                f"failure{'s' if left_out > 1 else ''} left out"
            )
        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.abort(grpc.StatusCode.UNKNOWN, status.message)

    # -- counters --------------------------------------------------------------------

    def _counter_arrays(self, name: str) -> tuple[list[int] | None, list[int] | None]:
        """(bytes, packets) arrays of a counter; None where its unit does not count that."""
        c = self.dataplane.counters
        byte_field, packet_field = surface.COUNTER_FIELDS[name]
        return (getattr(c, byte_field) if byte_field else None, getattr(c, packet_field))

    def _counter(self, store: TableStore, counter_id: int) -> surface.CounterInfo:
        info = store.pipe.counters.get(counter_id)
        if info is None:
            raise P4RuntimeError(code_pb2.NOT_FOUND, f"unknown counter id {counter_id}")
        return info

    def _indexes(self, info: surface.CounterInfo, entry: p4runtime_pb2.CounterEntry) -> range:
        """The cells a counter entry names: its index, or every cell when it has none."""
        size = min(info.size, self.dataplane.counters.size)
        if not entry.HasField("index"):
            return range(size)
        index = entry.index.index
        if index < 0:
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, f"negative index {index}")
        if index >= size:
            raise P4RuntimeError(code_pb2.OUT_OF_RANGE, f"index {index} outside {info.name}")
        return range(index, index + 1)

    def _write_counter(self, store: TableStore, update) -> None:
        entry = update.entity.counter_entry
        info = self._counter(store, entry.counter_id)
        if update.type != p4runtime_pb2.Update.MODIFY:
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, "counters can only be modified")
        indexes = self._indexes(info, entry)
        byte_array, packet_array = self._counter_arrays(info.name)
        for index in indexes:
            if byte_array is not None:
                byte_array[index] = entry.data.byte_count
            packet_array[index] = entry.data.packet_count

    def _read_counters(self, store: TableStore, query) -> Iterator[p4runtime_pb2.Entity]:
        infos = (
            [self._counter(store, query.counter_id)]
            if query.counter_id
            else list(store.pipe.counters.values())
        )
        for info in infos:
            indexes = self._indexes(info, query)
            byte_array, packet_array = self._counter_arrays(info.name)
            for index in indexes:
                entity = p4runtime_pb2.Entity()
                entry = entity.counter_entry
                entry.counter_id = info.id
                entry.index.index = index
                entry.data.packet_count = packet_array[index]
                if byte_array is not None:
                    entry.data.byte_count = byte_array[index]
                yield entity

    # -- read ------------------------------------------------------------------------

    def Read(self, request, context):
        try:
            self._check_device(request.device_id)
            with self.lock:
                store = self._require_pipeline()
                entities = []
                for query in request.entities:
                    which = query.WhichOneof("entity")
                    if which == "table_entry":
                        for entry in store.read(query.table_entry):
                            entity = p4runtime_pb2.Entity()
                            entity.table_entry.CopyFrom(entry)
                            entities.append(entity)
                    elif which == "counter_entry":
                        entities.extend(self._read_counters(store, query.counter_entry))
                    else:
                        raise P4RuntimeError(
                            code_pb2.UNIMPLEMENTED, f"reading {which} is not supported"
                        )
        except P4RuntimeError as err:
            self._abort(context, err)
        for start in range(0, len(entities), 1000):
            yield p4runtime_pb2.ReadResponse(entities=entities[start : start + 1000])


@dataclass(frozen=True)
class _Malformed:
    """What a request that does not parse as its message becomes, so that the method answers
    it INVALID_ARGUMENT (P4Runtime's code for a malformed request); grpcio's own
    deserialisation failure is INTERNAL, with a traceback in the switch's log."""

    message: str


def _lenient(cls):
    def parse(data: bytes):
        try:
            return cls.FromString(data)
        except DecodeError as err:
            return _Malformed(f"request is not a p4.v1.{cls.__name__} ({err})")

    return parse


def _unary(method):
    def call(request, context):
        if isinstance(request, _Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return method(request, context)

    return call


def _server_streaming(method):
    def call(request, context):
        if isinstance(request, _Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        yield from method(request, context)

    return call


def _checked(requests):
    for request in requests:
        if isinstance(request, _Malformed):
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, request.message)
        yield request


def _bidirectional(method):
    return lambda requests, context: method(_checked(requests), context)


_STREAMING = {"Read": "unary_stream", "StreamChannel": "stream_stream"}
"""P4Runtime's methods that stream (its descriptor in this protobuf does not say which)."""


def _handlers(service: SwitchService) -> grpc.GenericRpcHandler:
    """The P4Runtime service's methods, each parsing its requests leniently (above)."""
    methods = {}
    for method in p4runtime_pb2.DESCRIPTOR.services_by_name["P4Runtime"].methods:
        request = getattr(p4runtime_pb2, method.input_type.name)
        response = getattr(p4runtime_pb2, method.output_type.name)
        kind = _STREAMING.get(method.name, "unary_unary")
        wrap = {
            "unary_unary": _unary,
            "unary_stream": _server_streaming,
            "stream_stream": _bidirectional,
        }[kind]
        methods[method.name] = getattr(grpc, f"{kind}_rpc_method_handler")(
            wrap(getattr(service, method.name)),
            request_deserializer=_lenient(request),
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler("p4.v1.P4Runtime", methods)


def serve(service: SwitchService, address: str, tls: ServerTls | None = None) -> grpc.Server:
    """Start the gRPC server, over TLS when `tls` is given (mutual TLS when it names a client
    CA: a client without a certificate that CA signed is refused in the handshake, before
    any RPC). Raises OSError when the address cannot be bound, TlsError for a certificate or
    key that is not a readable PEM file."""
    credentials = None
    if tls is not None:
        cert, key, client_ca = tls.pems()
        credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_STREAMS + UNARY_WORKERS))
    server.add_generic_rpc_handlers((_handlers(service),))
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as err:  # grpcio raises where it cannot bind, or use the key pair
        raise OSError(f"cannot listen on {address}: {err}") from None
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server
