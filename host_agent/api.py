"""The agent's local API over a Unix stream socket: JSON lines, raw bytes after a `send`.

Protocol, one JSON object per line in each direction:

    -> {"op": "begin_step", "step": 1, "critical": false, "expected_gradient_bytes": 65536}
    -> {"op": "register_flow", "flow": 7, "step": 1, "traffic_class": "gradient",
        "deliver": false, "size": 65536}
    -> {"op": "send", "dst": "10.0.0.2", "flow": 7, "traffic_class": "gradient", "step": 1,
        "nbytes": 65536}            followed by exactly nbytes raw bytes
    -> {"op": "complete_step", "step": 1}
    -> {"op": "forget_step", "step": 1}
    -> {"op": "step_state", "step": 1}
    -> {"op": "stats"}

Every request may carry an "id"; each is answered by
{"event": "reply", "id": ..., "ok": true, ...} or {..., "ok": false, "error": "..."}.
Events go to every connected client: {"event": "send_done", ...},
{"event": "recv_done", ...} (both with "shed": true for a shed message),
{"event": "flow_failed", ...} and {"event": "bound_violation", ...}; a
recv_done for a flow registered with "deliver": true carries "nbytes" and is
followed by the flow's bytes (forgiven ranges zero-filled). Traffic classes:
gradient, tensor-parallel, pipeline-parallel, other. The fields are those of
the dataclasses in `host_agent.events`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from host_agent.agent import HostAgent
from host_agent.events import Event, RecvDone, record

CLIENT_BACKLOG = 1 << 30
"""Bytes of unread events a client may accumulate before it is dropped."""


@dataclass
class _Client:
    conn: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    """Events and replies not yet taken by the client; written as it reads."""
    pending: dict[str, Any] | None = None
    """A `send` request whose payload bytes have not all arrived yet."""


def check_api_path(path: str) -> None:
    """Raise OSError unless a socket can be created at `path` without destroying a file."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"--api {path}: no directory {parent}")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"--api {path} exists and is not a socket")


def _remove_stale_socket(path: str) -> None:
    """Remove a socket left at `path` by an earlier agent; refuse to touch anything else."""
    check_api_path(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class ApiServer:
    """Serves the local API for one agent from inside the agent's own event loop."""

    def __init__(self, agent: HostAgent, path: str) -> None:
        self.agent = agent
        self.path = path
        _remove_stale_socket(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.clients: dict[int, _Client] = {}
        agent.add_reader(self.sock.fileno(), self._accept)
        agent.apps.append(self)

    def close(self) -> None:
        for client in list(self.clients.values()):
            self._drop(client)
        if self in self.agent.apps:
            self.agent.apps.remove(self)
        self.agent.remove_reader(self.sock.fileno())
        self.sock.close()
        _remove_stale_socket(self.path)

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        client = _Client(conn)
        self.clients[conn.fileno()] = client
        self.agent.add_reader(conn.fileno(), lambda: self._read(client))

    def _drop(self, client: _Client) -> None:
        fd = client.conn.fileno()
        if fd < 0:
            return
        self.clients.pop(fd, None)
        self.agent.remove_reader(fd)
        self.agent.remove_writer(fd)
        client.conn.close()

    def _read(self, client: _Client) -> None:
        try:
            data = client.conn.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        client.buf += data
        while self._next_request(client):
            pass

    def _next_request(self, client: _Client) -> bool:
        """Handle one complete request from the client's buffer; False when none is complete."""
        if client.pending is None:
            end = client.buf.find(b"\n")
            if end < 0:
                return False
            line = bytes(client.buf[:end])
            del client.buf[: end + 1]
            try:
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("a request is a JSON object")
            except ValueError as exc:
                self._reply(client, {}, error=f"bad request line: {exc}")
                return True
            if request.get("op") != "send":
                self._handle(client, request, b"")
                return True
            client.pending = request
        request = client.pending
        nbytes = request.get("nbytes")
        if not isinstance(nbytes, int) or nbytes < 0:
            client.pending = None
            self._reply(client, request, error="send needs a non-negative integer nbytes")
            return True
        if len(client.buf) < nbytes:
            return False
        payload = bytes(client.buf[:nbytes])
        del client.buf[:nbytes]
        client.pending = None
        self._handle(client, request, payload)
        return True

    def _handle(self, client: _Client, request: dict[str, Any], payload: bytes) -> None:
        endpoint = self.agent.endpoint
        now = self.agent.now()
        op = request.get("op")
        extra: dict[str, Any] = {}
        try:
            if op == "begin_step":
                endpoint.begin_step(
                    int(request["step"]),
                    bool(request["critical"]),
                    int(request["expected_gradient_bytes"]),
                    now,
                )
            elif op == "register_flow":
                size = request.get("size")
                endpoint.register_flow(
                    int(request["flow"]),
                    int(request["step"]),
                    str(request["traffic_class"]),
                    now,
                    deliver=bool(request.get("deliver", False)),
                    size=None if size is None else int(size),
                )
            elif op == "send":
                step = request.get("step")
                endpoint.send(
                    str(request["dst"]),
                    int(request["flow"]),
                    payload,
                    str(request["traffic_class"]),
                    now,
                    step=None if step is None else int(step),
                )
            elif op == "complete_step":
                endpoint.complete_step(int(request["step"]), now)
            elif op == "forget_step":
                endpoint.forget_step(int(request["step"]))
            elif op == "step_state":
                extra = {"state": asdict(endpoint.step_state(int(request["step"])))}
            elif op == "stats":
                summary = self.agent.summary()
                extra = {
                    "counters": {k: v for k, v in summary.items() if isinstance(v, int)},
                    **summary,
                }
            else:
                raise ValueError(f"unknown op {op!r}")
        except KeyError as exc:
            self._reply(client, request, error=f"{op}: missing field {exc}")
            return
        except (ValueError, TypeError) as exc:
            self._reply(client, request, error=f"{op}: {exc}")
            return
        self._reply(client, request, **extra)

    def _reply(
        self, client: _Client, request: dict[str, Any], error: str | None = None, **extra: Any
    ) -> None:
        reply = {"event": "reply", "id": request.get("id"), "op": request.get("op")}
        reply.update({"ok": False, "error": error} if error else {"ok": True, **extra})
        self._write(client, json.dumps(reply).encode() + b"\n")

    def handle_event(self, event: Event, now: float) -> None:
        """Every event goes to every client as one JSON line, a delivery's bytes after it."""
        message = record(event)
        payload = event.payload if isinstance(event, RecvDone) else None
        if payload is not None:
            message["nbytes"] = len(payload)
        data = json.dumps(message).encode() + b"\n" + (payload or b"")
        for client in list(self.clients.values()):
            self._write(client, data)

    def get_timer(self) -> float | None:
        return None

    def handle_timer(self, now: float) -> None:
        pass

    def _write(self, client: _Client, data: bytes) -> None:
        """Queue bytes for a client without ever blocking the agent's loop on it."""
        if client.out:
            client.out += data
        else:
            client.out = bytearray(data)
            self._flush(client)
            if client.out:
                self.agent.add_writer(client.conn.fileno(), lambda: self._flush(client))
        if len(client.out) > CLIENT_BACKLOG:
            self._drop(client)

    def _flush(self, client: _Client) -> None:
        try:
            sent = client.conn.send(client.out)
        except BlockingIOError:
            return
        except OSError:
            self._drop(client)
            return
        del client.out[:sent]
        if not client.out:
            self.agent.remove_writer(client.conn.fileno())


class AgentClient:
    """A blocking client of the local API, for tests, tools and out-of-process workloads."""

    def __init__(self, path: str, connect_timeout: float = 10.0, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + connect_timeout
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no agent listening on {path}") from None
                time.sleep(0.05)
        self.sock.settimeout(timeout)
        self._file: BinaryIO = self.sock.makefile("rb")
        self._ids = iter(range(1, 1 << 62))
        self.events: list[tuple[dict[str, Any], bytes | None]] = []

    def close(self) -> None:
        self._file.close()
        self.sock.close()

    def call(self, op: str, payload: bytes | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply; events that arrive meanwhile are kept."""
        request_id = next(self._ids)
        request = {"op": op, "id": request_id, **fields}
        if payload is not None:
            request["nbytes"] = len(payload)
        self.sock.sendall(json.dumps(request).encode() + b"\n" + (payload or b""))
        while True:
            message, data = self._read_message()
            if message.get("event") == "reply" and message.get("id") == request_id:
                return message
            self.events.append((message, data))

    def wait_event(self, predicate, timeout: float = 30.0) -> tuple[dict[str, Any], bytes | None]:
        """The first kept or new event for which `predicate(event)` holds."""
        for i, (event, data) in enumerate(self.events):
            if predicate(event):
                del self.events[i]
                return event, data
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                event, data = self._read_message()
            except TimeoutError:
                raise TimeoutError("no matching event from the agent") from None
            if predicate(event):
                return event, data
            self.events.append((event, data))

    def _read_message(self) -> tuple[dict[str, Any], bytes | None]:
        line = self._file.readline()
        if not line:
            raise ConnectionError("the agent closed the API connection")
        message = json.loads(line)
        data = None
        if message.get("event") != "reply" and "nbytes" in message:
            data = self._file.read(message["nbytes"])
        return message, data
