"""FAKE GPU driver: GPUs described in a YAML file, with fault injection.

This is the one fake at the GPU-driver seam (the real one is ``nvml``), for
machines without GPUs: tests, demos, benchmarks. The file::

    gpus:
      - uuid: GPU-5f2c0000-0000-0000-0000-000000000000
        model: A100-SXM4-80GB
        memoryMiB: 81920
        numaNode: 0                 # default 0
        architecture: ampere        # default unknown
        index: 0                    # default: position; indexes must be 0..n-1
        labels: {nvlink: "true"}    # extra selector labels
        health: Healthy             # or Unhealthy (fault injection)
        reason: "XID 79"            # why unhealthy
        present: true               # false: the GPU has vanished
        processes:                  # per-process usage the usage monitor samples
          - {pid: 4242, memoryMiB: 3000, smPct: 40}   # smPct optional
        usageError: ""              # non-empty: sampling this GPU fails (an NVML error)
        facts: {computeCapability: "8.0", powerLimitW: 400}   # its make (fakeboard)
        telemetry: {temperatureC: 40, eccVolatileUncorrected: 0}  # health readings
        mig: {devices: [{profile: 3g.40gb, start: 4}]}  # MIG mode and devices (fakemig)
    topology: [[X, NV12], [NV12, X]]  # nvidia-smi topo -m's words (fakeboard)
    nvlinkVersion: 3

Faults are injected by editing the file (it is re-read when it changes) or
from a test through ``set_health`` / ``set_present`` / ``set_processes`` /
``set_usage_error`` / ``set_telemetry``, which rewrite the file. Health is judged from
``health`` and ``telemetry`` by the same ``health.HealthJudge`` as NVML's readings
(recovering at once unless ``recover_after_s`` says otherwise). Compute modes set by the ``mps``
provider are kept in ``compute_modes`` (``set_compute_mode_error`` makes setting
them fail). A GPU's memory in use is the sum of its processes'.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpupool.contract.yamlcheck import FLAG, SCALAR, TEXT, WHOLE, Map, Seq, load_text
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.nodeagent import fakeboard, fakemig
from gpupool.nodeagent.gpu import (
    HEALTHY,
    UNHEALTHY,
    GpuInfo,
    GpuUsage,
    HealthListener,
    ProcessUsage,
)
from gpupool.nodeagent.health import Finding, GpuReading, HealthConfig, HealthJudge, Level

log = logging.getLogger(__name__)

PROCESS = Map({"pid": WHOLE, "memoryMiB": WHOLE, "smPct": WHOLE}, required=frozenset({"pid"}))
FAKE_GPU = Map({
    "uuid": TEXT,
    "model": TEXT,
    "memoryMiB": WHOLE,
    "numaNode": WHOLE,
    "architecture": TEXT,
    "index": WHOLE,
    "labels": Map({}, others=SCALAR),
    "health": TEXT,
    "reason": TEXT,
    "present": FLAG,
    "processes": Seq(PROCESS),
    "usageError": TEXT,
    "facts": fakeboard.FACTS,
    "telemetry": fakeboard.TELEMETRY,
    "mig": fakemig.SHAPE,
}, required=frozenset({"uuid", "memoryMiB"}))
FAKE_GPU_FILE = Map({"gpus": Seq(FAKE_GPU), "topology": fakeboard.TOPOLOGY,
                     "nvlinkVersion": WHOLE}, required=frozenset({"gpus"}))
"""Every key a fake GPU file may hold (docs/fake-gpus.md); others are errors."""


class FakeGpuBackend:
    """FAKE: the GPUs of a YAML file; re-reads it when it changes."""

    def __init__(self, path: Path, poll_s: float = 0.05, health: HealthConfig | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.path = Path(path)
        self.poll_s = poll_s
        self.judge = HealthJudge(health or HealthConfig(recover_after_s=0.0))
        self.clock = clock
        self._lock = threading.Lock()
        self._body = load_file(self.path)
        self._stamp = _stamp(self.path)
        self._seen: tuple[GpuInfo, ...] = ()
        self._listener: HealthListener | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.compute_modes: dict[str, bool] = {}  # uuid -> EXCLUSIVE_PROCESS
        self._mode_error = ""

    def discover(self) -> tuple[GpuInfo, ...]:
        with self._lock:
            return self._judged()

    def readings(self) -> tuple[GpuReading, ...]:
        with self._lock:
            entries = [e for e in self._body["gpus"] if e.get("present", True)]
            return tuple(fakeboard.reading(e, str(self.path))
                         for e in sorted(entries, key=lambda e: str(e["uuid"])))

    def _judged(self) -> tuple[GpuInfo, ...]:
        """The present GPUs, their health judged from ``health`` and ``telemetry``."""
        entries = {str(e["uuid"]): e for e in self._body["gpus"]}
        out = []
        for gpu in board_gpus(self._body, str(self.path)):
            e = entries[gpu.uuid]
            injected = () if e.get("health", HEALTHY) == HEALTHY else \
                (Finding(Level.UNHEALTHY, str(e.get("reason") or "injected fault")),)
            v = self.judge.judge(fakeboard.reading(e, str(self.path)), self.clock(), injected)
            healthy = v.level is not Level.UNHEALTHY
            out.append(replace(gpu, healthy=healthy, reason="" if healthy else v.reason,
                               degraded=v.reason if v.level is Level.DEGRADED else ""))
        return tuple(out)

    def watch(self, listener: HealthListener) -> None:
        self._listener = listener
        self._thread = threading.Thread(target=self._poll, name="fake-gpu-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    # -- usage and compute mode -------------------------------------------------
    def usage(self) -> tuple[GpuUsage, ...]:
        with self._lock:
            entries = [e for e in self._body["gpus"] if e.get("present", True)]
        return tuple(_usage(e) for e in sorted(entries, key=lambda e: int(e.get("index", 0))))

    def set_compute_mode(self, uuid: str, exclusive_process: bool) -> None:
        if self._mode_error:
            raise GpupoolError(self._mode_error)
        self.compute_modes[uuid] = exclusive_process

    def set_compute_mode_error(self, reason: str) -> None:
        """Make ``set_compute_mode`` fail with ``reason`` ("" heals it)."""
        self._mode_error = reason

    def set_processes(self, uuid: str, processes: list[tuple[int, int, int | None]]) -> None:
        """Replace the processes on a GPU: (pid, memory MiB, SM % or None)."""
        self._edit(uuid, {"processes": [
            {"pid": pid, "memoryMiB": mib, **({} if sm is None else {"smPct": sm})}
            for pid, mib, sm in processes]})

    def set_usage_error(self, uuid: str, reason: str) -> None:
        """Make sampling the GPU fail with ``reason`` ("" heals it)."""
        self._edit(uuid, {"usageError": reason})

    # -- fault injection ------------------------------------------------------
    def set_health(self, uuid: str, healthy: bool, reason: str = "") -> None:
        """Turn a GPU unhealthy (with a reason) or healthy again."""
        self._edit(uuid, {"health": HEALTHY if healthy else UNHEALTHY,
                          "reason": "" if healthy else (reason or "injected fault")})

    def set_present(self, uuid: str, present: bool) -> None:
        """Make a GPU vanish (False) or come back (True)."""
        self._edit(uuid, {"present": present})

    def set_mig(self, uuid: str, body: Mapping[str, Any]) -> None:
        """Replace a GPU's ``mig`` entry (``fakemig``: what the fake driver makes)."""
        self._edit(uuid, {"mig": dict(body)})

    def entries(self) -> list[dict[str, Any]]:
        """The file's GPU entries as last read (copies)."""
        with self._lock:
            return [dict(e) for e in self._body["gpus"]]

    def set_telemetry(self, uuid: str, **telemetry: Any) -> None:
        """Replace what the GPU's next health reading says (the file's ``telemetry`` keys,
        e.g. ``eccVolatileUncorrected=1``, ``lost=True``, ``clockEvents=[...]``)."""
        self._edit(uuid, {"telemetry": telemetry})

    def _edit(self, uuid: str, changes: Mapping[str, Any]) -> None:
        with self._lock:
            entries = [dict(e) for e in self._body["gpus"]]
            match = [e for e in entries if e.get("uuid") == uuid]
            if not match:
                raise InvalidInput(f"fake GPU file {self.path} has no GPU {uuid}")
            match[0].update(changes)
            body = {**self._body, "gpus": entries}
            board_gpus(body, str(self.path))  # validate before writing
            _write(self.path, body)
            self._body, self._stamp = body, _stamp(self.path)
            current = self._judged()
        self._notify(current)

    # -- file watching ----------------------------------------------------------
    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            stamp = _stamp(self.path)
            if stamp != self._stamp:
                self._reload(stamp)
            elif self.judge.config.recover_after_s:  # a recovery may be due
                current = self.discover()
                if current != self._seen:
                    self._notify(current)

    def _reload(self, stamp: tuple[int, int, int]) -> None:
        try:
            body = load_file(self.path)
        except InvalidInput as exc:
            self._stamp = stamp
            if not self._stop.wait(self.poll_s) and _stamp(self.path) == stamp:
                log.error("ignoring edit of fake GPU file: %s", exc)  # not a write in progress
            return
        with self._lock:
            self._body, self._stamp = body, stamp
            current = self._judged()
        self._notify(current)

    def _notify(self, gpus: tuple[GpuInfo, ...]) -> None:
        self._seen = gpus
        if self._listener is not None:
            self._listener(gpus)


def load_entries(path: Path) -> list[dict[str, Any]]:
    """The GPU entries of a fake GPU file, validated (``InvalidInput`` says what is wrong)."""
    return list(load_file(path)["gpus"])


def load_file(path: Path) -> dict[str, Any]:
    """A fake GPU file's body, validated: ``gpus`` and the board's ``topology``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        body = load_text(text, str(path), FAKE_GPU_FILE, yaml.SafeLoader, yaml.YAMLError)
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read fake GPU file {path}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None
    except yaml.YAMLError as exc:
        raise InvalidInput(f"fake GPU file {path} is not YAML: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("gpus"), list):
        raise InvalidInput(f"fake GPU file {path} needs a top-level 'gpus' list")
    entries = body["gpus"]
    if not all(isinstance(e, dict) for e in entries):
        raise InvalidInput(f"fake GPU file {path}: every entry of 'gpus' must be a mapping")
    body = {**body, "gpus": [dict(e) for e in entries]}
    board_gpus(body, str(path))
    return body


def board_gpus(body: Mapping[str, Any], where: str = "fake GPU file") -> tuple[GpuInfo, ...]:
    """The present GPUs of a validated body, with their links, facts and telemetry checked."""
    entries = body["gpus"]
    gpus = gpus_of(entries, where)
    by_index = sorted((_gpu(e, i, where) for i, e in enumerate(entries)), key=lambda g: g.index)
    links = fakeboard.links(body.get("topology"), [g.uuid for g in by_index],
                            int(body.get("nvlinkVersion", 0)), where)
    for e in entries:
        fakeboard.reading(e, where)
    return tuple(replace(g, links=links.get(g.uuid, ())) for g in gpus)


def gpus_of(entries: list[dict[str, Any]], where: str = "fake GPU file") -> tuple[GpuInfo, ...]:
    """The present GPUs of validated entries, ordered by index."""
    gpus = [_gpu(e, i, where) for i, e in enumerate(entries)]
    uuids = [g.uuid for g in gpus]
    indexes = [g.index for g in gpus]
    if len(set(uuids)) != len(uuids) or len(set(indexes)) != len(indexes):
        raise InvalidInput(f"{where}: GPU uuids and indexes must be unique")
    if sorted(indexes) != list(range(len(indexes))):
        raise InvalidInput(f"{where}: GPU indexes must be 0..n-1 (NVML numbers GPUs so), "
                           f"got {sorted(indexes)}")
    present = [g for g, e in zip(gpus, entries, strict=True) if e.get("present", True)]
    return tuple(sorted(present, key=lambda g: g.index))


def _gpu(e: Mapping[str, Any], position: int, where: str) -> GpuInfo:
    uuid = e.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise InvalidInput(f"{where}: GPU #{position} needs a uuid")
    health = e.get("health", HEALTHY)
    if health not in (HEALTHY, UNHEALTHY):
        raise InvalidInput(f"{where}: GPU {uuid} health must be {HEALTHY} or {UNHEALTHY}")
    labels = e.get("labels") or {}
    if not isinstance(labels, dict):
        raise InvalidInput(f"{where}: GPU {uuid} labels must be a mapping")
    _check_processes(e.get("processes"), uuid, where)
    try:
        return GpuInfo(
            uuid=uuid, index=_int(e, "index", position, uuid, where),
            model=str(e.get("model", "unknown")),
            memory_mib=_int(e, "memoryMiB", None, uuid, where),
            numa_node=_int(e, "numaNode", 0, uuid, where),
            architecture=str(e.get("architecture", "unknown")),
            healthy=health == HEALTHY, reason=str(e.get("reason", "") or ""),
            labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
            facts=fakeboard.facts(e),
            mig=fakemig.read(e, uuid, str(e.get("model", "unknown")),
                             _int(e, "memoryMiB", None, uuid, where), where))
    except InvalidInput:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{where}: GPU {uuid}: {exc}") from None


def _int(e: Mapping[str, Any], key: str, default: int | None, uuid: str, where: str) -> int:
    value = e.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{where}: GPU {uuid}: {key} must be a whole number >= 0")
    if key == "memoryMiB" and value == 0:
        raise InvalidInput(f"{where}: GPU {uuid}: memoryMiB must be positive")
    return value


def _stamp(path: Path) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _write(path: Path, body: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(dict(body), sort_keys=False, default_flow_style=None))
    os.replace(tmp, path)


def _check_processes(processes: Any, uuid: str, where: str) -> None:
    if processes is None:
        return
    if not isinstance(processes, list) or not all(isinstance(p, dict) for p in processes):
        raise InvalidInput(f"{where}: GPU {uuid}: processes must be a list of mappings")
    for p in processes:
        for key in ("pid", "memoryMiB", "smPct"):
            value = p.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(f"{where}: GPU {uuid}: process {key} must be a whole "
                                   "number >= 0")


def _usage(e: Mapping[str, Any]) -> GpuUsage:
    uuid = str(e["uuid"])
    if e.get("usageError"):
        return GpuUsage(uuid, error=f"FAKE NVML: {e['usageError']}")
    procs = tuple(ProcessUsage(int(p["pid"]), int(p.get("memoryMiB", 0)),
                               int(p["smPct"]) if "smPct" in p else None)
                  for p in e.get("processes") or ())
    busy = [p.sm_pct for p in procs if p.sm_pct is not None]
    return GpuUsage(uuid, sum(p.memory_mib for p in procs), min(100, sum(busy)), procs)
