"""The model's side channel for what P4Runtime has no API for: line rates and buffer sizes.

BMv2 takes these over Thrift (`simple_switch_CLI set_queue_rate/depth`); the
model takes one JSON object per line on a unix socket and answers one JSON
object per line:

    {"cmd": "set_port", "port": 1, "rate_bps": 1000000000,
     "low_queue_bytes": 8388608, "high_queue_bytes": 1048576}   -> {"ok": true}
    {"cmd": "set_queue_rate", "port": 1, "priority": 0, "pps": 2}  -> {"ok": true}
    {"cmd": "stats"}   -> {"ok": true, "stats": {...occupancy, drop reasons...}}

`set_port` sets the line rate (bits/s, 0 unpaced) and buffer sizes;
`set_queue_rate` is BMv2's per-priority drain rate (priority 0 low, 1 high;
packets/s, 0 unpaced), which the PTF suite uses to hold a standing queue.

A request that cannot be carried out gets {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading

from switch_model.dataplane import Dataplane


def _non_negative(request: dict, key: str) -> int | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
    return value


def handle(dataplane: Dataplane, request: dict) -> dict:
    cmd = request.get("cmd")
    if cmd == "stats":
        return {"ok": True, "stats": dataplane.stats()}
    port = request.get("port")
    if cmd in ("set_port", "set_queue_rate") and port not in dataplane.ports:
        raise ValueError(f"no port {port!r} (ports: {sorted(dataplane.ports)})")
    if cmd == "set_queue_rate":
        if request.get("priority") not in (0, 1):
            raise ValueError("priority must be 0 (low) or 1 (high)")
        pps = request.get("pps")
        if not isinstance(pps, int | float) or isinstance(pps, bool) or pps < 0:
            raise ValueError(f"pps must be a non-negative number, got {pps!r}")
        dataplane.set_queue_rate(port, request["priority"], pps)
        return {"ok": True}
    if cmd == "set_port":
        dataplane.set_shaping(
            port,
            _non_negative(request, "rate_bps"),
            _non_negative(request, "low_queue_bytes"),
            _non_negative(request, "high_queue_bytes"),
        )
        return {"ok": True}
    raise ValueError(f"unknown cmd {cmd!r}")


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, dataplane: Dataplane):
        if os.path.exists(path):
            os.unlink(path)
        self.dataplane = dataplane
        super().__init__(path, _Handler)
        self.path = path

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name="control", daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if os.path.exists(self.path):
            os.unlink(self.path)


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            try:
                reply = handle(self.server.dataplane, json.loads(line))
            except (ValueError, TypeError, AttributeError) as err:
                reply = {"ok": False, "error": str(err)}
            self.wfile.write(json.dumps(reply).encode() + b"\n")


def request(path: str, message: dict, timeout: float = 5.0) -> dict:
    """Send one request to a model's control socket and return the reply (for controllers)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(message).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    answer = json.loads(reply)
    if not answer.get("ok"):
        raise ValueError(answer.get("error", "control request failed"))
    return answer
