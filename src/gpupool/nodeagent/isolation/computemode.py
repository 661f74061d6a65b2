"""GPU compute modes set by a separate privileged helper, asked over a unix socket.

The ``mps`` provider keeps a GPU in ``EXCLUSIVE_PROCESS`` while it serves shared slices
(only the MPS server may open a context there) and in ``DEFAULT`` otherwise. NVIDIA's
driver lets only a process holding ``CAP_SYS_ADMIN`` change a compute mode; the node
agent holds no capability, so it asks ``gpupool mps-helper`` — a process that holds only
that capability and does only this — through ``ComputeModeClient``, which implements the
same ``ComputeModes`` seam the GPU backends do.

The protocol, one request per connection, each a line of JSON of at most
``MAX_LINE_BYTES``::

    -> {"gpu": "<uuid>", "mode": "EXCLUSIVE_PROCESS" | "DEFAULT"}
    <- {"ok": true}   or   {"error": "<what went wrong, a sentence>"}

The helper (``ComputeModeHelper``) sets modes only on GPUs of its own node (the
backend's inventory), answers only processes of its own user (``SO_PEERCRED``) on a
socket only that user may open (mode 0600, in a 0700 directory), reads a line for at most
``timeout_s``, and answers anything else with an error, never a crash.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.isolation.provider import ComputeModes

log = logging.getLogger(__name__)

SOCKET = Path("/run/gpupool/mps-helper/compute-mode.sock")
MAX_LINE_BYTES = 512
MODES = {"EXCLUSIVE_PROCESS": True, "DEFAULT": False}


def _mode_name(exclusive_process: bool) -> str:
    return "EXCLUSIVE_PROCESS" if exclusive_process else "DEFAULT"


class ComputeModeClient:
    """``ComputeModes`` through the helper's socket. A helper not there yet (it starts
    beside the agent, or restarts) is waited for up to ``patience_s``."""

    def __init__(self, path: Path = SOCKET, timeout_s: float = 10.0, patience_s: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.patience_s = patience_s
        self._sleep = sleep

    def set_compute_mode(self, uuid: str, exclusive_process: bool) -> None:
        request = {"gpu": uuid, "mode": _mode_name(exclusive_process)}
        answer = self._ask(json.dumps(request).encode() + b"\n")
        if answer.get("ok") is not True:
            raise GpupoolError(f"the MPS helper: {answer.get('error') or 'no answer'}")

    def _ask(self, line: bytes) -> dict[str, Any]:
        waited = 0.0
        while True:
            try:
                return self._exchange(line)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if waited >= self.patience_s:
                    raise GpupoolError(
                        f"the MPS helper does not answer on {self.path} ({exc.strerror}): it "
                        "runs as the DaemonSet gpupool-mps-helper on nodes labelled "
                        "gpupool.io/isolation-provider=mps (chart value "
                        "nodeAgent.mpsHelper.enabled)") from None
                self._sleep(0.2)
                waited += 0.2
            except OSError as exc:
                raise GpupoolError(f"the MPS helper on {self.path}: {exc}") from None

    def _exchange(self, line: bytes) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(str(self.path))
            sock.sendall(line)
            answer = sock.makefile("rb").readline(MAX_LINE_BYTES + 1)
        try:
            out = json.loads(answer)
        except ValueError:
            out = None
        if not isinstance(out, dict):
            raise GpupoolError(f"the MPS helper on {self.path} answered {answer[:80]!r}")
        return out


class ComputeModeHelper:
    """Serves compute-mode requests on ``path`` until ``stop``; thread-safe."""

    def __init__(self, path: Path, modes: ComputeModes, gpus: Callable[[], set[str]],
                 timeout_s: float = 5.0):
        self.path = Path(path)
        self.modes = modes
        self.gpus = gpus
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # one mode change at a time
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.parent.chmod(0o700)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        helper = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = self.timeout_s

            def handle(self) -> None:
                helper.serve(self.connection, self.rfile, self.wfile)

        old = os.umask(0o177)
        try:
            server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        finally:
            os.umask(old)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="mps-helper",
                                        daemon=True)
        self._thread.start()
        log.info("serving compute modes on %s", self.path)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)
        self.path.unlink(missing_ok=True)

    def serve(self, conn: socket.socket, rfile: Any, wfile: Any) -> None:
        """Answer one connection; never raises."""
        try:
            answer = self.answer(conn, rfile.readline(MAX_LINE_BYTES + 1))
        except OSError as exc:  # the caller went away or was too slow: nothing to answer
            log.warning("compute-mode request not read: %s", exc)
            return
        try:
            wfile.write(json.dumps(answer).encode() + b"\n")
        except OSError as exc:
            log.warning("compute-mode answer not sent: %s", exc)

    def answer(self, conn: socket.socket, line: bytes) -> dict[str, Any]:
        """The answer to one request ``line`` read from ``conn``."""
        problem = _peer_problem(conn)
        if problem:
            return {"error": problem}
        try:
            uuid, exclusive = self._request(line)
            with self._lock:
                self.modes.set_compute_mode(uuid, exclusive)
        except GpupoolError as exc:
            log.warning("compute-mode request refused: %s", exc)
            return {"error": str(exc)}
        log.info("GPU %s: compute mode %s", uuid, _mode_name(exclusive))
        return {"ok": True}

    def _request(self, line: bytes) -> tuple[str, bool]:
        if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
            raise GpupoolError(f"a request is one line of at most {MAX_LINE_BYTES} bytes")
        try:
            request = json.loads(line)
        except ValueError:
            raise GpupoolError("a request is a JSON object") from None
        if not isinstance(request, dict) or set(request) != {"gpu", "mode"}:
            raise GpupoolError('a request is {"gpu": <uuid>, "mode": <mode>} and nothing else')
        uuid, mode = request["gpu"], request["mode"]
        if mode not in MODES:
            raise GpupoolError(f"mode {str(mode)[:40]!r} is not one of "
                               f"{', '.join(sorted(MODES))}")
        if not isinstance(uuid, str) or uuid not in self.gpus():
            raise GpupoolError(f"{str(uuid)[:80]!r} is not a GPU of this node")
        return uuid, MODES[mode]


def _peer_problem(conn: socket.socket) -> str:
    """Why the process at the other end may not ask ("" when it may): only the helper's
    own user may."""
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError as exc:
        return f"the caller cannot be identified ({exc})"
    _, uid, _ = struct.unpack("3i", raw)
    if uid != os.geteuid():
        return f"user {uid} may not change compute modes"
    return ""
