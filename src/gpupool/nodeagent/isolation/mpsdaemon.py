"""One CUDA MPS control daemon for one GPU, spoken to through ``nvidia-cuda-mps-control``.

The daemon is ``nvidia-cuda-mps-control -f`` (foreground, so the agent sees it exit)
with ``CUDA_VISIBLE_DEVICES=<GPU uuid>`` — it serves that GPU only, as device 0 —
and its own pipe and log directories (``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_LOG_DIRECTORY``). Commands go the way the MPS documentation gives them:
``nvidia-cuda-mps-control`` without options, the command on its standard input, the
same pipe directory in its environment; a non-zero exit means the daemon did not
answer. Commands used:

* ``get_server_list`` — the PIDs of running MPS servers (also the health check);
* ``set_default_device_pinned_mem_limit 0 <MiB>M`` and
  ``set_default_active_thread_percentage <pct>`` — the per-client limits of servers
  started from now on;
* ``set_device_pinned_mem_limit <server PID> 0 <MiB>M`` and
  ``set_active_thread_percentage <server PID> <pct>`` — the same for a running server
  (clients that connect from now on);
* ``quit`` — clean shutdown.

Daemon settings are lost when it quits; ``apply`` is therefore called again after
every restart. A test may stand a fake executable in for ``nvidia-cuda-mps-control``
(the GPU-driver seam); the protocol spoken here is the real one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpupool.core.errors import GpupoolError

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"


class MpsError(GpupoolError):
    """The control daemon could not be started or did not answer; the message says why."""


@dataclass(frozen=True, slots=True)
class MpsLimits:
    """Per-client limits: device pinned memory (MiB) and active thread percentage."""

    memory_mib: int
    thread_pct: int


@dataclass(frozen=True, slots=True)
class MpsLayout:
    """Host directories: ``<root>/<uuid>/pipe``, ``<root>/<uuid>/log``, ``<root>/shm``."""

    root: Path

    def pipe(self, uuid: str) -> Path:
        return self.root / uuid / "pipe"

    def log(self, uuid: str) -> Path:
        return self.root / uuid / "log"

    @property
    def shm(self) -> Path:
        return self.root / "shm"


class MpsDaemon:
    """The control daemon of one GPU: start, health, limits, stop. Thread-safe."""

    def __init__(self, uuid: str, layout: MpsLayout, control: str = CONTROL,
                 timeout_s: float = 5.0):
        self.uuid = uuid
        self.layout = layout
        self.control = control
        self.timeout_s = timeout_s
        self.limits: MpsLimits | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.RLock()

    def env(self) -> dict[str, str]:
        return {**os.environ, "CUDA_VISIBLE_DEVICES": self.uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(self.layout.pipe(self.uuid)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.layout.log(self.uuid))}

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the daemon, or adopt one that already answers on the pipe directory."""
        with self._lock:
            for d in (self.layout.pipe(self.uuid), self.layout.log(self.uuid)):
                try:
                    d.mkdir(parents=True, exist_ok=True)
                    d.chmod(0o755)
                except OSError as exc:
                    raise MpsError(f"cannot prepare {d} for GPU {self.uuid}: "
                                   f"{exc.strerror or exc}") from None
            if self._answers():
                log.info("MPS control daemon for GPU %s already runs; adopted", self.uuid)
            else:
                self._spawn()
            if self.limits is not None:
                self._send_limits(self.limits)

    def _spawn(self) -> None:
        self._close_log()
        self._log = open(self.layout.log(self.uuid) / "gpupool-control.out", "ab")  # noqa: SIM115
        try:
            self._proc = subprocess.Popen([self.control, "-f"], env=self.env(),
                                          stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise MpsError(f"cannot start {self.control} for GPU {self.uuid}: "
                           f"{exc.strerror or exc}") from None
        deadline = time.monotonic() + self.timeout_s
        while not self._answers():
            if self._proc.poll() is not None:
                raise MpsError(f"{self.control} for GPU {self.uuid} exited with "
                               f"{self._proc.returncode} at start (see its log in "
                               f"{self.layout.log(self.uuid)})")
            if time.monotonic() > deadline:
                raise MpsError(f"{self.control} for GPU {self.uuid} did not answer within "
                               f"{self.timeout_s:g} s")
            time.sleep(0.02)
        log.info("started MPS control daemon for GPU %s (pid %d, pipe %s)", self.uuid,
                 self._proc.pid, self.layout.pipe(self.uuid))

    def stop(self) -> None:
        """``quit``, then wait for the process (terminate it if it does not go)."""
        with self._lock:
            try:
                self.query("quit")
            except MpsError as exc:
                log.warning("MPS control daemon for GPU %s: quit failed: %s", self.uuid, exc)
            proc, self._proc = self._proc, None
            if proc is not None:
                try:
                    proc.wait(self.timeout_s)
                except subprocess.TimeoutExpired:
                    proc.terminate()
                    proc.wait(self.timeout_s)
            self._close_log()

    def problem(self) -> str:
        """Why the daemon is not serving ("" when it is)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is not None:
                return f"the MPS control daemon exited with {self._proc.returncode}"
            try:
                self.query("get_server_list")
            except MpsError as exc:
                return str(exc)
            return ""

    def restart(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(self.timeout_s)
            self.start()

    # -- commands ------------------------------------------------------------------------
    def query(self, command: str) -> str:
        """Send one command through ``nvidia-cuda-mps-control``; its answer (stdout)."""
        try:
            done = subprocess.run([self.control], input=command + "\n", env=self.env(),
                                  capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"MPS control for GPU {self.uuid}: {command!r} failed: "
                           f"{type(exc).__name__}: {exc}") from None
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip() or f"exit status {done.returncode}"
            raise MpsError(f"MPS control for GPU {self.uuid} did not answer {command!r}: "
                           f"{said}")
        return done.stdout

    def servers(self) -> list[int]:
        """PIDs of the running MPS servers."""
        return [int(w) for w in self.query("get_server_list").split() if w.isdigit()]

    def apply(self, limits: MpsLimits) -> None:
        """Per-client limits for every client that connects from now on."""
        with self._lock:
            self._send_limits(limits)
            self.limits = limits

    def _send_limits(self, limits: MpsLimits) -> None:
        """A zero is left unset (a slice that holds no memory sets no memory limit)."""
        servers = self.servers()
        if limits.memory_mib > 0:
            self.query(f"set_default_device_pinned_mem_limit 0 {limits.memory_mib}M")
            for pid in servers:
                self.query(f"set_device_pinned_mem_limit {pid} 0 {limits.memory_mib}M")
        if limits.thread_pct > 0:
            self.query(f"set_default_active_thread_percentage {limits.thread_pct}")
            for pid in servers:
                self.query(f"set_active_thread_percentage {pid} {limits.thread_pct}")
        log.info("MPS limits of GPU %s: %d MiB, %d %% active threads per client", self.uuid,
                 limits.memory_mib, limits.thread_pct)

    def _answers(self) -> bool:
        try:
            self.query("get_server_list")
        except MpsError:
            return False
        return True

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
