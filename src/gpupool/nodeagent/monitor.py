"""The usage monitor: what containers really use of their GPUs, and what is done about it.

Every sample (``sample_once``, every ``--monitor-seconds``):

1. ask the GPU backend for each GPU's processes (NVML
   ``nvmlDeviceGetComputeRunningProcesses``, ``nvmlDeviceGetProcessUtilization``);
   a GPU whose sample fails is skipped (``gpupool_node_monitor_skipped_total``);
2. map each process to its pod and container: ``/proc/<pid>/cgroup`` names the pod
   UID and the runtime's container id (``cgroups``), the pod's status names the
   container; processes that are gone, unreadable or outside pods are skipped and
   counted by reason, never guessed;
3. compare each container's use with its slice — the slices of verified decisions
   only; a process in a pod that holds no slice of that GPU is compared with zero —
   in ``overuse.OveruseTracker`` (grace period, compute window); a burstable slice's
   limit is cut to its request first while its GPU's requests need the room
   (``burst``, ``burstreport``);
4. for every container that *became* an over-user: a log line, an Event
   (``GpupoolOverUse``), the annotation ``gpupool.io/over-use`` on the pod, the metric
   ``gpupool_node_container_over_use`` and the configured action (``Actions``); for
   every one that stopped being one, all of it undone (Event ``GpupoolOverUseEnded``).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.core.allocation import Slice
from gpupool.core.errors import GpupoolError
from gpupool.nodeagent import cgroups
from gpupool.nodeagent.burstreport import BurstWatch
from gpupool.nodeagent.gpu import GpuUsage
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.nodestate import holds_gpus
from gpupool.nodeagent.overuse import Changes, Observation, OveruseTracker
from gpupool.nodeagent.pods import Pod
from gpupool.nodeagent.verify import DecisionGate

log = logging.getLogger(__name__)

SliceKey = tuple[str, str, str]  # (pod uid, container, GPU uuid)


@dataclass(frozen=True, slots=True)
class Held:
    slice: Slice
    exclusive: bool


def held_slices(pods: Iterable[Pod], gate: DecisionGate) -> dict[SliceKey, Held]:
    """The slices that verified decisions of pods holding GPUs give their containers."""
    out: dict[SliceKey, Held] = {}
    for pod in pods:
        try:
            if not holds_gpus(pod) or not gate.trusted(pod):
                continue
            decision = pod.decision()
        except GpupoolError:
            continue
        if decision is None or decision.allocation.served_by:  # its server's use counts
            continue
        for s in decision.allocation.slices:
            out[(pod.uid, s.container, s.gpu_uuid)] = Held(s, decision.allocation.exclusive)
    return out


@dataclass
class _Use:
    memory_mib: int = 0
    sm_pct: int | None = None
    pids: list[int] = field(default_factory=list)

    def add(self, memory_mib: int, sm_pct: int | None, pid: int) -> None:
        self.memory_mib += memory_mib
        self.pids.append(pid)
        if sm_pct is not None:
            self.sm_pct = (self.sm_pct or 0) + sm_pct


class Attribution:
    """Processes -> (pod, container) through their cgroups; skipped ones counted."""

    def __init__(self, proc_root: Path, pods: Sequence[Pod], held: dict[SliceKey, Held]):
        self.proc_root = proc_root
        self.by_uid = {p.uid: p for p in pods}
        self.held = held
        self.skipped: dict[str, int] = defaultdict(int)
        self.stand_ins: dict[str, Pod] = {}  # pod uid -> the pod acted on in its stead

    def observe(self, usage: Sequence[GpuUsage]) -> tuple[list[Observation], frozenset[str]]:
        used: dict[SliceKey, _Use] = defaultdict(_Use)
        failed = set()
        for gpu in usage:
            if gpu.error:
                failed.add(gpu.uuid)
                self.skipped["gpu-sample-failed"] += 1
                log.warning("usage sample of GPU %s skipped: %s", gpu.uuid, gpu.error)
                continue
            for proc in gpu.processes:
                key = self._key(proc.pid, gpu.uuid)
                if key is not None:
                    used[key].add(proc.memory_mib, proc.sm_pct, proc.pid)
        return self._observations(used, failed), frozenset(failed)

    def _key(self, pid: int, gpu: str) -> SliceKey | None:
        try:
            owner = cgroups.owner(self.proc_root, pid)
        except cgroups.CgroupUnreadable as exc:
            reason = "process-gone" if "is gone" in str(exc) else \
                "not-in-a-pod" if "not in a pod" in str(exc) else "cgroup-unreadable"
            self.skipped[reason] += 1
            log.debug("process %d on GPU %s skipped: %s", pid, gpu, exc)
            return None
        pod = self.by_uid.get(owner.pod_uid)
        if pod is None:
            self.skipped["pod-unknown"] += 1
            return None
        name = pod.container_named(owner.container_id)
        if name is None:  # status not seen yet: the pod's only container on this GPU
            mine = [k for k in self.held if k[0] == pod.uid and k[2] == gpu]
            name = mine[0][1] if len(mine) == 1 else None
        if name is None:
            self.skipped["container-unknown"] += 1
            return None
        return (pod.uid, name, gpu)

    def _observations(self, used: dict[SliceKey, _Use], failed: set[str]) -> list[Observation]:
        out = []
        for key in sorted(set(used) | {k for k in self.held if k[2] not in failed}):
            use, held = used.get(key, _Use(0, 0)), self.held.get(key)
            pod = self.by_uid[key[0]]
            limit_mib = held.slice.memory_limit_mib if held else 0
            limit_pct = held.slice.core_limit_pct if held else 0
            sm = use.sm_pct if key in used else 0
            out.append(Observation(key[0], pod.ref, key[1], key[2], use.memory_mib, sm,
                                   limit_mib, limit_pct, held.exclusive if held else False,
                                   held.slice.burst_memory_mib if held else 0,
                                   held.slice.burst_core_pct if held else 0, tuple(use.pids)))
        return out


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    node: str
    proc_root: Path = Path("/proc")
    period_s: float = 10.0


class UsageMonitor:
    """Samples usage, tracks over-users and has ``on_changes`` act on what changed."""

    def __init__(self, config: MonitorConfig, usage: Callable[[], Sequence[GpuUsage]],
                 pods: Callable[[], list[Pod]], gate: DecisionGate, tracker: OveruseTracker,
                 on_changes: Callable[[Changes, dict[str, Pod]], None],
                 metrics: NodeMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 attribution: Callable[[Sequence[Pod]], Attribution] | None = None,
                 bursts: BurstWatch | None = None):
        self.config = config
        self.usage = usage
        self.pods = pods
        self.gate = gate
        self.tracker = tracker
        self.on_changes = on_changes
        self.metrics = metrics
        self.clock = clock
        self.attribution = attribution  # None: the slices of verified decisions (``gate``)
        self.bursts = bursts  # None: no burst reclaim (slices without burst limits)
        self.last: list[Observation] = []
        self.last_usage: tuple[GpuUsage, ...] = ()

    def sample_once(self) -> Changes:
        start = time.process_time(), time.perf_counter()
        pods = self.pods()
        usage = tuple(self.usage())
        seen = self.attribution(pods) if self.attribution is not None else \
            Attribution(self.config.proc_root, pods, held_slices(pods, self.gate))
        observations, skipped = seen.observe(usage)
        stand_ins = getattr(seen, "stand_ins", {})  # an attribution may name none
        by_uid, now = {**{p.uid: p for p in pods}, **stand_ins}, self.clock()
        if self.bursts is not None:
            observations = self.bursts.judge(now, observations, usage, by_uid)
        changes = self.tracker.update(now, observations, skipped)
        self.last, self.last_usage = observations, usage
        self.on_changes(changes, by_uid)
        if self.metrics is not None:
            self._export(seen, observations, changes)
            self.metrics.sample_seconds.observe(time.perf_counter() - start[1])
        log.debug("usage sample: %d containers, %.1f ms CPU", len(observations),
                  (time.process_time() - start[0]) * 1000)
        return changes

    def _export(self, seen: Attribution, observations: list[Observation],
                changes: Changes) -> None:
        m = self.metrics
        assert m is not None
        for reason, n in seen.skipped.items():
            m.skipped.labels(reason).inc(n)
        over = {o.seen.key for o in changes.current}
        live = []
        for o in observations:
            ns, _, name = o.pod_ref.partition("/")
            labels = (ns, name, o.container, o.gpu_uuid)
            live.append(labels)
            m.c_used.labels(*labels).set(o.memory_mib)
            m.c_limit.labels(*labels).set(o.memory_limit_mib)
            m.c_compute.labels(*labels).set(o.core_limit_pct)
            if o.sm_pct is not None:
                m.c_util.labels(*labels).set(o.sm_pct)
            m.c_over.labels(*labels).set(1 if o.key in over else 0)
        m.forget_containers_except(live)
        for gpu in self.last_usage:
            if not gpu.error:
                m.gpu_used.labels(gpu.uuid).set(gpu.memory_used_mib)
                if gpu.utilization_pct is not None:
                    m.gpu_util.labels(gpu.uuid).set(gpu.utilization_pct)
