"""The project's one P4Runtime client: a connection to one switch that survives its restart.

The controller, the PTF suite, the tests and the benchmarks all drive switches
through `SwitchClient`, naming tables and counters through `P4InfoIndex`.
It is built on the p4runtime protobufs and grpcio directly rather than on
p4runtime-shell: the shell keeps one global connection, its client calls
sys.exit when a handshake fails, and its batch-error iterator (0.0.6) never
returns once a batch mixes succeeded and failed updates. A controller of
several switches needs none of that. Every call that finds the switch gone
reconnects (new channel, new arbitration) and retries once, so a restarted
switch is picked up without restarting the controller.

Only writers arbitrate. Every forgive controller asks for the same election
id, so a second writer to a switch is refused (`NotPrimary`) instead of
silently taking the switch over; a reader (`connect(primary=False)`) opens no
stream at all, since P4Runtime serves Read to any client.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from common.tls import ClientTls

log = logging.getLogger(__name__)

_Get = p4runtime_pb2.GetForwardingPipelineConfigRequest


ELECTION_ID = 1
"""What every writer asks for: equal ids make the switch refuse the second one."""


class SwitchUnreachable(ConnectionError):
    """The switch did not answer, or would not make this controller its primary."""


class NotPrimary(SwitchUnreachable):
    """Another controller holds the switch: this one may read but not write."""


class WriteFailed(RuntimeError):
    """A Write batch in which some updates failed; `errors` holds (index, code name, message)."""

    def __init__(self, errors: list[tuple[int, str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"update {i}: {code} {msg}" for i, code, msg in errors))


def batch_errors(err: grpc.RpcError) -> list[tuple[int, str, str]]:
    """The failed updates of a Write, from the google.rpc.Status in its trailer."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            errors = []
            for i, packed in enumerate(status.details):
                error = p4runtime_pb2.Error()
                if packed.Unpack(error) and error.canonical_code != code_pb2.OK:
                    errors.append((i, code_pb2.Code.Name(error.canonical_code), error.message))
            if errors:
                return errors
    # No trailer, or one cut short before the first failure: the status message says it all.
    return [(-1, err.code().name, err.details() or "write failed")]


GONE_POLL_S = 0.1
"""How often a reconnect that waits asks `SwitchClient.gone`."""


@dataclass
class SwitchClient:
    name: str
    address: str
    device_id: int = 1
    election_id: int = ELECTION_ID
    timeout: float = 5.0
    tls: ClientTls | None = None
    """P4Runtime over TLS (common.tls): the switches' CA, and the controller's own certificate
    where the switch asks for one; None speaks without TLS (loopback, Mininet's namespaces)."""
    gone: Callable[[], bool] | None = field(default=None, compare=False)
    """Whether the switch's process has exited, where the caller knows (the emulation's
    runner does): a reconnect then stops waiting at once instead of for the whole timeout,
    which outlasts the flows' patience (15 timeout rounds, about 4 s at bytes / 64)."""

    def __post_init__(self):
        self.channel: grpc.Channel | None = None
        self.stub: p4runtime_pb2_grpc.P4RuntimeStub | None = None
        self.primary = True
        self._outbox: queue.Queue | None = None
        self._receiver: threading.Thread | None = None
        self._lost = threading.Event()

    # -- connection ------------------------------------------------------------------

    def connect(self, primary: bool = True) -> None:
        """Open the channel and, for a writer, become primary; raise SwitchUnreachable
        (NotPrimary when another controller holds the switch)."""
        self.close()
        self.primary = primary
        self.channel = self._channel()
        ready = grpc.channel_ready_future(self.channel)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                ready.result(timeout=max(0.0, min(GONE_POLL_S, deadline - time.monotonic())))
                break
            except grpc.FutureTimeoutError:
                if self.gone is not None and self.gone():
                    self.close()
                    raise SwitchUnreachable(
                        f"switch {self.name} at {self.address}: its process has exited"
                    ) from None
                if time.monotonic() >= deadline:
                    self.close()
                    raise SwitchUnreachable(
                        f"switch {self.name} at {self.address} did not answer within "
                        f"{self.timeout:g} s{self._handshake_hint()}"
                    ) from None
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self._lost.clear()
        if primary:
            self._arbitrate()

    def _channel(self) -> grpc.Channel:
        """The channel to the switch: TLS with the CA (and the controller's pair) of `tls`, or
        none. TlsError (a ValueError) for a file that cannot be used."""
        if self.tls is None:
            return grpc.insecure_channel(self.address)
        ca, cert, key = self.tls.pems()
        credentials = grpc.ssl_channel_credentials(ca, key, cert)
        options = []
        if self.tls.server_name:
            options.append(("grpc.ssl_target_name_override", self.tls.server_name))
        return grpc.secure_channel(self.address, credentials, options=options)

    def _handshake_hint(self) -> str:
        """Why a switch that listens may never become ready: gRPC reports a failed TLS
        handshake only as a channel that does not connect."""
        if self.tls is None:
            return " (or it speaks only TLS)"
        return (
            " over TLS (or the handshake failed: its certificate not signed by the CA given "
            "or not for this address, ours missing or refused, or no TLS there)"
        )

    def _arbitrate(self) -> None:
        self._outbox = queue.Queue()
        replies: queue.Queue = queue.Queue()
        outbox = self._outbox

        def requests():
            while (message := outbox.get()) is not None:
                yield message

        stream = self.stub.StreamChannel(requests())

        def receive():
            try:
                for reply in stream:
                    replies.put(reply)
            except grpc.RpcError as err:
                replies.put(err)
            finally:
                self._lost.set()

        self._receiver = threading.Thread(target=receive, name=f"p4rt-{self.name}", daemon=True)
        self._receiver.start()
        request = p4runtime_pb2.StreamMessageRequest()
        request.arbitration.device_id = self.device_id
        request.arbitration.election_id.CopyFrom(self._election())
        outbox.put(request)
        try:
            reply = replies.get(timeout=self.timeout)
        except queue.Empty:
            reply = None
        where = f"switch {self.name} at {self.address}"
        if isinstance(reply, grpc.RpcError) and reply.code() == grpc.StatusCode.INVALID_ARGUMENT:
            # the election id we ask for is taken: another forgive controller is connected
            self.close()
            raise NotPrimary(
                f"{where}: not primary, another controller holds election id "
                f"{self.election_id}; stop it before writing"
            )
        if not isinstance(reply, p4runtime_pb2.StreamMessageResponse):
            detail = reply.details() if isinstance(reply, grpc.RpcError) else "no answer"
            self.close()
            raise SwitchUnreachable(f"{where}: arbitration: {detail}")
        if reply.arbitration.status.code != code_pb2.OK:
            self.close()
            raise NotPrimary(
                f"{where}: not primary ({reply.arbitration.status.message}); "
                "stop that controller before writing"
            )

    @property
    def stream_ended(self) -> bool:
        """A writer's arbitration stream has ended: the switch restarted or went away (its
        primary must arbitrate again, and a restarted switch holds nothing)."""
        return self.primary and self._lost.is_set()

    def close(self) -> None:
        """End the stream (waiting for the switch to drop it, so the election id is free for
        the next connection) and the channel; safe to call twice."""
        if self._outbox is not None:
            self._outbox.put(None)
            self._outbox = None
        if self._receiver is not None:
            self._receiver.join(timeout=self.timeout)
            self._receiver = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def _call(self, fn: Callable):
        """Run fn(); if the switch went away, reconnect once and run it again. A switch that
        lets a call's deadline pass (alive but stalled, or swamped) is SwitchUnreachable
        naming it: the bare DEADLINE_EXCEEDED names nothing."""
        if self.channel is None or self._lost.is_set():
            self.connect(self.primary)
        try:
            return self._named(fn)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        log.info("switch %s went away; reconnecting", self.name)
        self.connect(self.primary)
        return self._named(fn)

    def _named(self, fn: Callable):
        try:
            return fn()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            raise SwitchUnreachable(
                f"switch {self.name} at {self.address} did not answer in time "
                "(P4Runtime DEADLINE_EXCEEDED): stalled or overloaded"
            ) from None

    def _election(self) -> p4runtime_pb2.Uint128:
        return p4runtime_pb2.Uint128(
            high=self.election_id >> 64, low=self.election_id & (2**64 - 1)
        )

    # -- pipeline --------------------------------------------------------------------

    def get_pipeline(self) -> p4runtime_pb2.ForwardingPipelineConfig:
        request = _Get(device_id=self.device_id, response_type=_Get.P4INFO_AND_COOKIE)
        return self._call(
            lambda: self.stub.GetForwardingPipelineConfig(request, timeout=self.timeout)
        ).config

    def set_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes, cookie: int) -> None:
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            election_id=self._election(),
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
        )
        request.config.p4info.CopyFrom(p4info)
        request.config.p4_device_config = device_config
        request.config.cookie.cookie = cookie
        self._call(lambda: self.stub.SetForwardingPipelineConfig(request, timeout=60))

    # -- entities ----------------------------------------------------------------------

    def write(self, updates: list[p4runtime_pb2.Update]) -> None:
        if not updates:
            return
        request = p4runtime_pb2.WriteRequest(
            device_id=self.device_id, election_id=self._election(), updates=updates
        )
        try:
            self._call(lambda: self.stub.Write(request, timeout=self.timeout))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNKNOWN:
                raise
            raise WriteFailed(batch_errors(err)) from None

    def insert(self, entries: Iterable[p4runtime_pb2.TableEntry]) -> None:
        """Insert table entries in one batch (WriteFailed names the updates that failed)."""
        updates = []
        for entry in entries:
            update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
            update.entity.table_entry.CopyFrom(entry)
            updates.append(update)
        self.write(updates)

    def read(self, entities: Iterable[p4runtime_pb2.Entity]) -> list[p4runtime_pb2.Entity]:
        request = p4runtime_pb2.ReadRequest(device_id=self.device_id, entities=list(entities))

        def run():
            return [
                e for reply in self.stub.Read(request, timeout=self.timeout) for e in reply.entities
            ]

        return self._call(run)
