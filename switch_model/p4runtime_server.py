"""The model's P4Runtime service: pipeline config, arbitration, Write and Read.

Error reporting follows the P4Runtime specification: a Write whose updates
fail returns gRPC UNKNOWN with a google.rpc.Status in the
`grpc-status-details-bin` trailer holding one p4.v1.Error per update, in
order, OK for those that succeeded; every other RPC fails with the canonical
code itself.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from switch_model import surface
from switch_model.dataplane import Dataplane
from switch_model.surface import PipelineMismatch, load_pipeline
from switch_model.tables import P4RuntimeError, TableStore

API_VERSION = "1.4.1"
log = logging.getLogger(__name__)

_Set = p4runtime_pb2.SetForwardingPipelineConfigRequest
_Get = p4runtime_pb2.GetForwardingPipelineConfigRequest
_Atomicity = p4runtime_pb2.WriteRequest


def _grpc_code(code: int) -> grpc.StatusCode:
    return {c.value[0]: c for c in grpc.StatusCode}[code]


class Arbitration:
    """Which StreamChannel is primary: the one with the highest election id."""

    def __init__(self):
        self.streams: dict[int, tuple[int, queue.Queue]] = {}
        self.lock = threading.Lock()

    def primary_id(self) -> int | None:
        return max((eid for eid, _ in self.streams.values()), default=None)

    def join(self, stream: int, election_id: int, outbox: queue.Queue) -> None:
        with self.lock:
            for other, (eid, _) in self.streams.items():
                if other != stream and eid == election_id:
                    raise P4RuntimeError(
                        code_pb2.INVALID_ARGUMENT, f"election id {election_id} already in use"
                    )
            self.streams[stream] = (election_id, outbox)
            self._announce()

    def leave(self, stream: int) -> None:
        with self.lock:
            if self.streams.pop(stream, None) is not None:
                self._announce()

    def _announce(self) -> None:
        primary = self.primary_id()
        for eid, outbox in self.streams.values():
            outbox.put((eid == primary, primary))

    def check_primary(self, election_id: int) -> None:
        with self.lock:
            if self.primary_id() != election_id:
                raise P4RuntimeError(
                    code_pb2.PERMISSION_DENIED, f"election id {election_id} is not the primary"
                )


def _uint128(value) -> int:
    return (value.high << 64) | value.low


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
        context.abort(_grpc_code(err.code), err.message)

    # -- pipeline --------------------------------------------------------------------

    def SetForwardingPipelineConfig(self, request, context):
        try:
            self._check_device(request.device_id)
            self.arbitration.check_primary(_uint128(request.election_id))
            with self.lock:
                self._set_pipeline(request)
        except P4RuntimeError as err:
            self._abort(context, err)
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _set_pipeline(self, request) -> None:
        if request.action == _Set.COMMIT:
            if self.saved is None:
                raise P4RuntimeError(code_pb2.FAILED_PRECONDITION, "no saved pipeline to commit")
            self._commit(*self.saved)
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
        if request.action == _Set.VERIFY_AND_SAVE:
            self.saved = (request.config, pipe)
        elif request.action == _Set.VERIFY_AND_COMMIT:
            self._commit(request.config, pipe)

    def _commit(self, config, pipe: surface.Pipeline) -> None:
        self.config = p4runtime_pb2.ForwardingPipelineConfig()
        self.config.CopyFrom(config)
        self.store = TableStore(pipe)
        self.dataplane.pipeline.forwarding = self.store.compile()
        counters = self.dataplane.counters
        for values in (
            counters.tx_packets,
            counters.tx_bytes,
            counters.ce_marks,
            counters.trims,
            counters.drops,
        ):
            values[:] = [0] * len(values)
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
        outbox: queue.Queue = queue.Queue()
        state = {"device": None, "election": None}

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

        threading.Thread(target=reader, name=f"stream-{stream}", daemon=True).start()
        context.add_callback(lambda: self.arbitration.leave(stream))
        try:
            while True:
                item = outbox.get()
                if item is None:
                    return
                if isinstance(item, P4RuntimeError):
                    self._abort(context, item)
                is_primary, primary = item
                update = p4runtime_pb2.MasterArbitrationUpdate(device_id=state["device"])
                update.election_id.high = primary >> 64
                update.election_id.low = primary & ((1 << 64) - 1)
                if is_primary:
                    update.status.code = code_pb2.OK
                else:
                    update.status.code = code_pb2.ALREADY_EXISTS
                    update.status.message = "another controller is primary"
                yield p4runtime_pb2.StreamMessageResponse(arbitration=update)
        finally:
            self.arbitration.leave(stream)

    def _arbitrate(self, stream: int, update, outbox: queue.Queue, state: dict) -> None:
        self._check_device(update.device_id)
        if update.HasField("role") and update.role.name:
            raise P4RuntimeError(code_pb2.UNIMPLEMENTED, "roles are not supported")
        if not update.HasField("election_id"):
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, "arbitration without election id")
        state["device"] = update.device_id
        state["election"] = _uint128(update.election_id)
        self.arbitration.join(stream, state["election"], outbox)

    # -- write -----------------------------------------------------------------------

    def Write(self, request, context):
        try:
            self._check_device(request.device_id)
            self.arbitration.check_primary(_uint128(request.election_id))
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
        status = status_pb2.Status(code=code_pb2.UNKNOWN, message="write failed")
        for result in results:
            error = p4runtime_pb2.Error(canonical_code=code_pb2.OK)
            if result is not None:
                error.canonical_code = result.code
                error.message = result.message
            packed = any_pb2.Any()
            packed.Pack(error)
            status.details.append(packed)
        first = next(r for r in results if r is not None)
        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.abort(grpc.StatusCode.UNKNOWN, first.message)

    # -- counters --------------------------------------------------------------------

    def _counter_arrays(self, name: str) -> tuple[list[int] | None, list[int] | None]:
        """(bytes, packets) arrays of a counter; None where its unit does not count that."""
        c = self.dataplane.counters
        return {
            surface.PORT_TX: (c.tx_bytes, c.tx_packets),
            surface.PORT_CE_MARKS: (None, c.ce_marks),
            surface.PORT_TRIMS: (None, c.trims),
            surface.PORT_DROPS: (None, c.drops),
        }[name]

    def _counter(self, store: TableStore, counter_id: int) -> surface.CounterInfo:
        info = store.pipe.counters.get(counter_id)
        if info is None:
            raise P4RuntimeError(code_pb2.NOT_FOUND, f"unknown counter id {counter_id}")
        return info

    def _write_counter(self, store: TableStore, update) -> None:
        entry = update.entity.counter_entry
        info = self._counter(store, entry.counter_id)
        if update.type != p4runtime_pb2.Update.MODIFY:
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, "counters can only be modified")
        if not entry.HasField("index"):
            raise P4RuntimeError(code_pb2.INVALID_ARGUMENT, "counter write needs an index")
        index = entry.index.index
        if not 0 <= index < min(info.size, self.dataplane.counters.size):
            raise P4RuntimeError(code_pb2.OUT_OF_RANGE, f"index {index} outside {info.name}")
        byte_array, packet_array = self._counter_arrays(info.name)
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
            size = min(info.size, self.dataplane.counters.size)
            if query.HasField("index"):
                if not 0 <= query.index.index < size:
                    raise P4RuntimeError(code_pb2.OUT_OF_RANGE, f"index outside {info.name}")
                indexes = [query.index.index]
            else:
                indexes = range(size)
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


def serve(service: SwitchService, address: str) -> grpc.Server:
    """Start the gRPC server; raises OSError when the address cannot be bound."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(service, server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server
