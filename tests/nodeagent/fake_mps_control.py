"""FAKE ``nvidia-cuda-mps-control``: the stand-in at the GPU-driver seam for the MPS tests.

It behaves as the real executable does towards its caller:

* ``-f``: the control daemon in the foreground. It listens on the socket ``control`` in
  ``$CUDA_MPS_PIPE_DIRECTORY``, writes ``nvidia-cuda-mps-control.pid`` there, and
  answers the commands gpupool sends (``get_server_list``, ``start_server -uid N``,
  ``set_default_device_pinned_mem_limit``, ``set_default_active_thread_percentage``,
  ``set_device_pinned_mem_limit``, ``set_active_thread_percentage``, their ``get_``
  forms, ``quit``). Settings are lost on ``quit``, as with the real daemon. After every
  command it writes what it holds to ``fake-state.json`` in ``$CUDA_MPS_LOG_DIRECTORY``
  (for the tests to read) and logs the command to ``control.log`` there.
* no option: the client. Commands come on standard input, one per line; each is sent
  to the daemon of ``$CUDA_MPS_PIPE_DIRECTORY`` and its answer printed. Exit status 1
  when no daemon answers there.

Nothing here touches a GPU.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path


def _pipe() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _logdir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


class Daemon:
    def __init__(self) -> None:
        self.default_memory: dict[str, str] = {}
        self.default_threads = "100"
        self.servers: dict[int, dict[str, object]] = {}
        self.next_pid = 4000
        self.commands: list[str] = []

    def answer(self, line: str) -> tuple[str, bool]:
        words = line.split()
        self.commands.append(line)
        if not words:
            return "", False
        cmd, args = words[0], words[1:]
        if cmd == "quit":
            return "", True
        if cmd == "get_server_list":
            return "\n".join(str(p) for p in self.servers), False
        if cmd == "start_server" and args[:1] == ["-uid"]:
            self.next_pid += 1
            self.servers[self.next_pid] = {"uid": int(args[1]), "memory": dict(
                self.default_memory), "threads": self.default_threads}
            return "", False
        if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self.default_memory[args[0]] = args[1]
            return "", False
        if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return self.default_memory.get(args[0], "0M"), False
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            self.default_threads = args[0]
            return args[0], False
        if cmd == "get_default_active_thread_percentage":
            return self.default_threads, False
        return self._per_server(cmd, args)

    def _per_server(self, cmd: str, args: list[str]) -> tuple[str, bool]:
        server = self.servers.get(int(args[0])) if args and args[0].isdigit() else None
        if server is None:
            return f"Unrecognized command or server: {cmd} {' '.join(args)}", False
        if cmd == "set_device_pinned_mem_limit" and len(args) == 3:
            server["memory"] = {**dict(server["memory"]), args[1]: args[2]}  # type: ignore
            return "", False
        if cmd == "set_active_thread_percentage" and len(args) == 2:
            server["threads"] = args[1]
            return args[1], False
        return f"Unrecognized command: {cmd}", False

    def save(self) -> None:
        state = {"pid": os.getpid(), "defaultMemory": self.default_memory,
                 "defaultThreads": self.default_threads,
                 "servers": {str(k): v for k, v in self.servers.items()},
                 "commands": self.commands, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
        tmp = _logdir() / "fake-state.json.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, _logdir() / "fake-state.json")


def serve() -> int:
    pipe, logs = _pipe(), _logdir()
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    path = pipe / "control"
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    (pipe / "nvidia-cuda-mps-control.pid").write_text(str(os.getpid()))
    daemon = Daemon()
    daemon.save()
    with open(logs / "control.log", "a") as log:
        while True:
            conn, _ = sock.accept()
            with conn:
                line = conn.makefile().readline().strip()
                log.write(f"Cmd:{line}\n")
                log.flush()
                reply, done = daemon.answer(line)
                daemon.save()
                conn.sendall(reply.encode())
            if done:
                break
    sock.close()
    path.unlink(missing_ok=True)
    (pipe / "nvidia-cuda-mps-control.pid").unlink(missing_ok=True)
    return 0


def client() -> int:
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(_pipe() / "control"))
        except OSError:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        with sock:
            sock.sendall((line + "\n").encode())
            sock.shutdown(socket.SHUT_WR)
            reply = _read_all(sock)
        if reply:
            print(reply.decode())
    return 0


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["-f"] else client())
