"""Remote slices served on this node: their use, in the over-use monitor like a container's.

The controller runs each slice server as a pod in the slices' namespace bound to the
decided node, annotated ``gpupool.io/slice-spec`` with the slice it serves (the workload
pod's uid and name, container, GPU, limits; ``controller.sliceserver``). At each sample
``SliceAttribution``:

* reads each such server's ``/usage`` (``http://<pod IP>:14901/usage``: one record per
  session in the monitor's ``Observation`` fields, ``remote.usage``) and adds it as the
  workload container's observation of that GPU — the stub provider reports there;
* counts the GPU processes NVML sees in a server pod for the slice it serves (a
  ``command`` provider such as LUPINE reports nothing at ``/usage``: its process holds the
  GPU like a container's), never against a slice of the server pod itself;
* hands the server pod to the actions as the workload's stand-in: the node agent may
  write only pods on its own node, so the ``GpupoolOverUse`` Event and the
  ``gpupool.io/over-use`` annotation go on the server pod, and ``evict`` evicts the server
  (its slice is released; the controller reports it lost and it is placed again), while
  ``isolate`` isolates the GPU as for a local container. The per-container metrics name
  the workload's pod and container.

A server that does not answer is skipped for the sample (counted ``slice-server-silent``).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpupool.core.allocation import Slice
from gpupool.nodeagent import cgroups
from gpupool.nodeagent.gpu import GpuUsage
from gpupool.nodeagent.monitor import Attribution, Held, SliceKey
from gpupool.nodeagent.overuse import Observation
from gpupool.nodeagent.pods import Pod

log = logging.getLogger(__name__)

ANNOTATION_SPEC = "gpupool.io/slice-spec"
STATUS_PORT = 14901
Fetch = Callable[[str], list[dict[str, Any]]]
"""Pod IP -> the server's ``/usage`` records (``OSError``/``ValueError`` when silent)."""


@dataclass(frozen=True, slots=True)
class ServedSlice:
    """What a server pod says it serves (its ``gpupool.io/slice-spec``)."""

    server: Pod
    uid: str
    pod_ref: str
    container: str
    gpu_uuid: str
    memory_mib: int  # the limits the server enforces
    core_pct: int
    exclusive: bool
    burst_memory_mib: int = 0  # how much of them is burst, above the slice's request
    burst_core_pct: int = 0

    def observation(self, memory_mib: int, sm_pct: int | None, pids: tuple[int, ...] = ()
                    ) -> Observation:
        return Observation(self.uid, self.pod_ref, self.container, self.gpu_uuid, memory_mib,
                           sm_pct, self.memory_mib, self.core_pct, self.exclusive,
                           self.burst_memory_mib, self.burst_core_pct, pids=pids)

    def held_slice(self) -> Slice:
        """The slice as the monitor holds a local container's: request and burst."""
        return Slice(self.gpu_uuid, 0, self.memory_mib - self.burst_memory_mib,
                     self.core_pct - self.burst_core_pct, self.container,
                     self.burst_memory_mib, self.burst_core_pct)


def served_here(pods: Sequence[Pod], namespace: str) -> dict[str, ServedSlice]:
    """Server pod uid -> what it serves, for the live server pods of the slices' namespace."""
    out = {}
    for p in pods:
        raw = p.annotations.get(ANNOTATION_SPEC)
        if p.namespace != namespace or raw is None or not p.active:
            continue
        try:
            out[p.uid] = _served(p, json.loads(raw))
        except (ValueError, KeyError, TypeError):
            log.warning("slice server %s: unreadable %s", p.ref, ANNOTATION_SPEC)
    return out


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A server pod answers for itself: a redirect is an error, not followed."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"{msg}: redirect not followed",
                                     headers, fp)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
"""Straight to the pod's address: no proxy from the environment, no redirect."""


def _served(server: Pod, spec: dict[str, Any]) -> ServedSlice:
    """A server pod's ``gpupool.io/slice-spec`` (``ValueError``: a burst beyond a limit)."""
    s = ServedSlice(server, str(spec["uid"]), str(spec["pod"]), str(spec["container"]),
                    str(spec["gpu"]), int(spec["memoryMiB"]), int(spec["corePct"]),
                    bool(spec.get("exclusive", False)), int(spec.get("burstMemoryMiB", 0)),
                    int(spec.get("burstCorePct", 0)))
    if not (0 <= s.burst_memory_mib <= s.memory_mib and 0 <= s.burst_core_pct <= s.core_pct):
        raise ValueError("a burst beyond its limit")
    return s


def fetch_usage(ip: str, port: int = STATUS_PORT, timeout_s: float = 2.0
                ) -> list[dict[str, Any]]:
    """A slice server's ``/usage`` records."""
    with _OPENER.open(f"http://{ip}:{port}/usage", timeout=timeout_s) as answer:
        body = json.loads(answer.read(1 << 20))
    if not isinstance(body, list):
        raise ValueError("/usage is not a list")
    return [r for r in body if isinstance(r, dict)]


class SliceAttribution(Attribution):
    """``Attribution`` with the slices this node's servers serve (see the module)."""

    def __init__(self, proc_root: Path, pods: Sequence[Pod], held: dict[SliceKey, Held],
                 namespace: str, fetch: Fetch = fetch_usage):
        super().__init__(proc_root, pods, held)
        self.servers = served_here(pods, namespace)
        self.fetch = fetch
        self.reported: dict[SliceKey, Observation] = {}
        self.stand_ins = {s.uid: s.server for s in self.servers.values()}

    def observe(self, usage: Sequence[GpuUsage]) -> tuple[list[Observation], frozenset[str]]:
        self.reported = self._reported()
        seen, failed = super().observe(usage)
        refs = {s.uid: s.pod_ref for s in self.servers.values()}
        out = [replace(o, pod_ref=refs[o.pod_uid]) if o.pod_uid in refs else o for o in seen]
        keys = {o.key for o in out}
        out += [o for k, o in sorted(self.reported.items()) if k not in keys]
        return out, failed

    def _reported(self) -> dict[SliceKey, Observation]:
        out = {}
        for s in self.servers.values():
            ip = s.server.ip
            try:
                records = self.fetch(ip) if ip else []
            except (OSError, ValueError) as exc:
                self.skipped["slice-server-silent"] += 1
                log.debug("slice server %s: /usage: %s", s.server.ref, exc)
                continue
            for r in records:
                if r.get("pod_uid") == s.uid and r.get("gpu_uuid") == s.gpu_uuid:
                    memory, sm = r.get("memory_mib"), r.get("sm_pct")
                    o = s.observation(memory if isinstance(memory, int) else 0,
                                      sm if isinstance(sm, int) else None)
                    out[o.key] = o
        return out

    def _key(self, pid: int, gpu: str) -> SliceKey | None:
        try:
            owner = cgroups.owner(self.proc_root, pid)
        except cgroups.CgroupUnreadable:
            return super()._key(pid, gpu)
        s = self.servers.get(owner.pod_uid)
        if s is None:
            return super()._key(pid, gpu)
        key = (s.uid, s.container, s.gpu_uuid)
        if key in self.reported:  # the server reported it: not counted twice
            self.skipped["slice-server-reported"] += 1
            return None
        self.held.setdefault(key, Held(s.held_slice(), s.exclusive))
        self.by_uid.setdefault(s.uid, s.server)
        return key
