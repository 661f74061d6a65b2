"""``mps``: one CUDA MPS control daemon per GPU, run and supervised by the agent.

What it does:

* starts ``nvidia-cuda-mps-control`` for every GPU (``MpsDaemon``) and checks each
  every ``health_s``; a daemon that exits or stops answering is restarted (its limits
  applied again) and, until it serves, its GPU is reported unhealthy — kubelet and the
  extender stop placing slices there; ``stop`` quits every daemon cleanly;
* a shared slice gets its GPU's pipe directory (``/tmp/nvidia-mps``, the MPS default),
  its log directory (read-only) and the node's MPS ``/dev/shm`` mounted, and its own
  limits in ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` / ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``;
* in the daemon, where MPS enforces them and a client cannot raise them, every client
  of a GPU is limited to the largest shared slice held on that GPU (memory and active
  threads; ``sync`` keeps the ceiling current as slices come and go). A client's own
  variables can only lower its limits further: with equal slices on a GPU each client
  is held to its own slice; with unequal ones, to the largest;
* the GPU's compute mode is set to ``EXCLUSIVE_PROCESS`` while it serves shared slices,
  so that only the MPS server can open a context on it: a container cannot bypass MPS
  by dropping the pipe directory. Exclusive (whole-GPU) pods are kept off MPS: no pipe
  mounted, and their GPU's compute mode set back to ``DEFAULT``.

A shared slice spread over several GPUs cannot be served (a process is the client of
one MPS daemon) and is refused with that reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from gpupool.contract.isolation import ProviderName, mps_limits
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.nodeagent.envs import ContainerEdits, Mount
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.isolation.mpsdaemon import (
    CONTROL,
    MpsDaemon,
    MpsError,
    MpsLayout,
    MpsLimits,
)
from gpupool.nodeagent.isolation.provider import (
    ComputeModes,
    Holdings,
    ProviderRefusal,
    SliceGrant,
)

log = logging.getLogger(__name__)

PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
LOG_IN_CONTAINER = "/var/log/nvidia-mps"
SHM_IN_CONTAINER = "/dev/shm"


class MpsProvider:
    """The ``mps`` isolation provider of one node."""

    name = ProviderName.MPS

    def __init__(self, layout: MpsLayout, modes: ComputeModes, control: str = CONTROL,
                 health_s: float = 2.0, timeout_s: float = 5.0):
        self.layout = layout
        self.modes = modes
        self.control = control
        self.health_s = health_s
        self.timeout_s = timeout_s
        self.daemons: dict[str, MpsDaemon] = {}
        self.restarts: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}  # after failed restarts: when to try again
        self._backoff: dict[str, float] = {}
        self._problems: dict[str, str] = {}
        self._modes: dict[str, bool] = {}  # GPU uuid -> EXCLUSIVE_PROCESS set by us
        self._changed: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enforced(self) -> bool:
        return True

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, gpus: Sequence[GpuInfo], changed: Callable[[], None]) -> None:
        self._changed = changed
        try:
            self.layout.shm.mkdir(parents=True, exist_ok=True)
            self.layout.shm.chmod(0o1777)
        except OSError as exc:
            raise InvalidInput(f"the mps isolation provider cannot prepare {self.layout.shm}: "
                               f"{exc.strerror or exc} (check --mps-root)") from None
        for gpu in gpus:
            daemon = MpsDaemon(gpu.uuid, self.layout, self.control, self.timeout_s)
            self.daemons[gpu.uuid] = daemon
            self.restarts[gpu.uuid] = 0
            self._start_one(daemon)
        self._thread = threading.Thread(target=self._supervise, name="mps-supervisor",
                                        daemon=True)
        self._thread.start()

    def _start_one(self, daemon: MpsDaemon) -> None:
        try:
            daemon.start()
        except MpsError as exc:
            log.error("GPU %s takes no shared slices: %s", daemon.uuid, exc)
            self._set_problem(daemon.uuid, str(exc))
        else:
            self._set_problem(daemon.uuid, "")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s * 2)
        for daemon in self.daemons.values():
            daemon.stop()
        for uuid in sorted(u for u, on in self._modes.items() if on):
            self._mode(uuid, False, strict=False)
        log.info("stopped %d MPS control daemons", len(self.daemons))

    def _supervise(self) -> None:
        while not self._stop.wait(self.health_s):
            for daemon in list(self.daemons.values()):
                if self._stop.is_set():
                    return
                self._check(daemon)

    def _check(self, daemon: MpsDaemon) -> None:
        """Restart a daemon that is not serving; after failed restarts, back off (doubling
        up to a minute) so that a daemon that cannot start is not retried in a loop."""
        uuid = daemon.uuid
        if time.monotonic() < self._retry_at.get(uuid, 0.0):
            return
        problem = daemon.problem()
        if not problem:
            self._set_problem(uuid, "")
            return
        failing = uuid in self.problems()
        (log.info if failing else log.warning)(
            "MPS control daemon of GPU %s: %s; restarting it", uuid, problem)
        if not failing:  # a GPU already failing keeps its reason (why it cannot start)
            self._set_problem(uuid, problem)  # while the restart is tried: no flapping
        self.restarts[uuid] = self.restarts.get(uuid, 0) + 1
        try:
            daemon.restart()
        except MpsError as exc:
            wait = min(60.0, 2 * max(self.health_s, self._backoff.get(uuid, 0.0)))
            self._backoff[uuid] = wait
            self._retry_at[uuid] = time.monotonic() + wait
            (log.info if failing else log.error)(
                "GPU %s takes no shared slices: %s (next try in %.1f s)", uuid, exc, wait)
            self._set_problem(uuid, str(exc))
        else:
            self._backoff.pop(uuid, None)
            self._retry_at.pop(uuid, None)
            self._set_problem(uuid, "")

    def _set_problem(self, uuid: str, problem: str) -> None:
        with self._lock:
            before = self._problems.get(uuid, "")
            if problem:
                self._problems[uuid] = problem
            else:
                self._problems.pop(uuid, None)
        if bool(before) != bool(problem):
            self._changed()

    def problems(self) -> dict[str, str]:
        with self._lock:
            return {u: f"MPS: {p}" for u, p in self._problems.items()}

    def daemon_up(self, uuid: str) -> bool:
        with self._lock:
            return uuid in self.daemons and uuid not in self._problems

    # -- slices --------------------------------------------------------------------------
    def edits(self, grant: SliceGrant) -> ContainerEdits:
        uuids = list(dict.fromkeys(s.gpu_uuid for s in grant.slices))
        if grant.exclusive:
            for uuid in uuids:
                self._mode(uuid, False)
            return ContainerEdits()
        if len(uuids) != 1:
            raise ProviderRefusal(
                f"container {grant.container} holds shared slices of {len(uuids)} GPUs; with "
                "the mps isolation provider a process is the client of one GPU's MPS daemon, "
                "so ask one GPU per container (or whole GPUs)", "isolation-unsupported")
        uuid = uuids[0]
        daemon = self._serving(uuid)
        self._mode(uuid, True)
        self._raise(daemon, grant.slices[0].memory_limit_mib, grant.slices[0].core_limit_pct)
        envs = {"CUDA_MPS_PIPE_DIRECTORY": PIPE_IN_CONTAINER,
                "CUDA_MPS_LOG_DIRECTORY": LOG_IN_CONTAINER, **mps_limits(grant.slices)}
        mounts = (Mount(PIPE_IN_CONTAINER, str(self.layout.pipe(uuid))),
                  Mount(LOG_IN_CONTAINER, str(self.layout.log(uuid)), read_only=True),
                  Mount(SHM_IN_CONTAINER, str(self.layout.shm)))
        return ContainerEdits(envs, mounts)

    def _serving(self, uuid: str) -> MpsDaemon:
        daemon = self.daemons.get(uuid)
        problem = self.problems().get(uuid)
        if daemon is None or problem:
            raise ProviderRefusal(f"GPU {uuid} has no serving MPS control daemon "
                                  f"({problem or 'not started'})", "isolation-unavailable")
        return daemon

    def _raise(self, daemon: MpsDaemon, memory_mib: int, core_pct: int) -> None:
        """Make the GPU's per-client ceiling at least this slice (before it starts)."""
        now = daemon.limits or MpsLimits(0, 0)
        want = MpsLimits(max(now.memory_mib, memory_mib), max(now.thread_pct, core_pct))
        if want == daemon.limits:
            return
        try:
            daemon.apply(want)
        except MpsError as exc:
            raise ProviderRefusal(f"cannot set the MPS limits of GPU {daemon.uuid}: {exc}",
                                  "isolation-unavailable") from None

    def _mode(self, uuid: str, exclusive_process: bool, strict: bool = True) -> None:
        if self._modes.get(uuid) == exclusive_process:
            return
        try:
            self.modes.set_compute_mode(uuid, exclusive_process)
        except GpupoolError as exc:
            mode = "EXCLUSIVE_PROCESS" if exclusive_process else "DEFAULT"
            log.error("cannot set compute mode %s on GPU %s: %s", mode, uuid, exc)
            if strict:
                raise ProviderRefusal(f"cannot set compute mode {mode} on GPU {uuid} ({exc}); "
                                      "without it a container could bypass MPS",
                                      "isolation-unavailable") from None
            return
        self._modes[uuid] = exclusive_process

    def sync(self, holdings: Holdings, live_pods: set[str]) -> None:
        """The ceiling of every GPU: the largest shared slice's limit held on it now."""
        for uuid, daemon in self.daemons.items():
            slices = holdings.get(uuid) or ()
            if not slices or self.problems().get(uuid):
                continue
            want = MpsLimits(max(s.memory_limit_mib for s in slices),
                             max(s.core_limit_pct for s in slices))
            if want != daemon.limits:
                try:
                    daemon.apply(want)
                except MpsError as exc:
                    log.warning("could not lower the MPS limits of GPU %s: %s", uuid, exc)
