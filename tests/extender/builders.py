"""Small builders of Kubernetes objects for extender tests (plain dicts, as the API serves)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.core.allocation import Allocation
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.core.serving import ServingConfig
from gpupool.extender.bind.gangclaims import GangSettings
from gpupool.extender.metrics import Metrics
from gpupool.extender.preemption.plans import PreemptionSettings
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.feeds import Feeds, start_feeds
from gpupool.extender.state.signatures import DecisionCheck, DecisionKeys
from gpupool.kube.api import KubeApi
from gpupool.kube.keystore import ensure_signing_keys, read_signing_keys
from gpupool.security.signing import SigningKeys, claims_of


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_obj(name: str, cpu: str = "64", memory: str = "512Gi",
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "capacity": {"cpu": cpu, "memory": memory, "pods": "110"}}}


def gpu_obj(node: str, index: int, model: str = "A100", memory_mib: int = 40960,
            health: str = "Healthy", labels: dict[str, str] | None = None,
            heartbeat: str | None = None) -> dict[str, Any]:
    uuid = f"GPU-{node}-{index}"
    return {"metadata": {"name": uuid.lower(),
                         "labels": {"gpupool.io/node": node, "gpupool.io/model": model}},
            "spec": {"node": node, "uuid": uuid, "index": index, "model": model,
                     "memoryMiB": memory_mib, "architecture": "ampere",
                     "numaNode": 0 if index < 4 else 1, "labels": labels or {}},
            "status": {"health": health, "heartbeatTime": heartbeat or now_rfc3339()}}


def pod_obj(name: str, limits: dict[str, Any] | None = None, ns: str = "default",
            annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
            cpu: str = "1", memory: str = "1Gi", containers: int = 1) -> dict[str, Any]:
    resources = {"requests": {"cpu": cpu, "memory": memory, **(limits or {})},
                 "limits": dict(limits or {})}
    return {"metadata": {"name": name, "namespace": ns, "annotations": annotations or {},
                         "labels": labels or {}},
            "spec": {"schedulerName": "gpupool-scheduler",
                     "containers": [{"name": f"c{k}", "image": "busybox", "resources": resources}
                                    for k in range(containers)]},
            "status": {"phase": "Pending"}}


def seed_cluster(fake: FakeApiServer, nodes: int, gpus: int = 8, model: str = "A100",
                 memory_mib: int = 40960, prefix: str = "n") -> list[str]:
    names = [f"{prefix}{i}" for i in range(nodes)]
    for name in names:
        fake.seed("nodes", node_obj(name))
        for j in range(gpus):
            fake.seed("gpudevices", gpu_obj(name, j, model, memory_mib))
    return names


NAMESPACE = "gpupool-system"


def local_keys() -> DecisionKeys:
    """Decision keys held in memory (for caches built without an API server)."""
    keys = SigningKeys().added(0.0)
    return DecisionKeys(lambda: keys, time.time, keys=keys)


def signed(keys: DecisionKeys, alloc: Allocation, namespace: str, name: str,
           bind_time: str = "2026-01-01T00:00:00Z", phase: str = names.PHASE_ALLOCATING,
           group: str | None = None) -> dict[str, str]:
    """The annotations the extender writes for ``alloc`` (key: the pod uid), signed."""
    notes = records.encode(alloc, bind_time, phase)
    if group:
        notes[names.ANNOTATION_RESOURCE_GROUP] = group
    notes[names.ANNOTATION_SIGNATURE] = keys.sign(claims_of(alloc.key, namespace, name, notes))
    return notes


def decision_keys(api: KubeApi, clock: Callable[[], float] = time.time) -> DecisionKeys:
    """The extender's signing keys on this API server, made on first use (as at start)."""
    first = ensure_signing_keys(api, NAMESPACE, clock())
    return DecisionKeys(lambda: read_signing_keys(api, NAMESPACE)[0], clock, keys=first)


class Replica:
    """One extender wired to the fake API server (its own client, keys, cache and
    informers), as ``gpupool extender`` wires one."""

    def __init__(self, fake: FakeApiServer, policy: str = DEFAULT_POLICY, seed: int = 0,
                 stale_after_s: float = 120.0, clock: Callable[[], float] = time.time,
                 scheduler_name: str = "gpupool-scheduler",
                 preemption: PreemptionSettings | None = None,
                 serving: ServingConfig | None = None, gangs: GangSettings | None = None):
        self.api = KubeApi.connect(server=fake.url)
        self.keys = decision_keys(self.api, clock)
        metrics = Metrics()
        self.cache = ClusterCache(stale_after_s=stale_after_s, clock=clock,
                                  decisions=DecisionCheck(self.keys, metrics.unverified))
        self.feeds: Feeds = start_feeds(self.api, self.cache, watch_timeout_s=2,
                                        pod_groups=gangs is not None)
        settings = Settings(policy, seed=seed, scheduler_name=scheduler_name,
                            preemption=preemption or PreemptionSettings(),
                            serving=serving or ServingConfig(),
                            gangs=gangs or GangSettings(namespace=NAMESPACE))
        self.extender = Extender(self.cache, settings, metrics, self.api, self.keys, clock)

    def close(self) -> None:
        self.extender.close()
        self.feeds.stop(timeout_s=0.0)  # the watch threads end with their streams
        self.api.close()


def schedule(ext: Extender, pod: dict[str, Any], nodes: list[str]) -> tuple[str | None, str]:
    """filter -> prioritize -> bind as kube-scheduler would: (node or None, error text)."""
    result = ext.filter({"Pod": pod, "Nodes": None, "NodeNames": nodes})
    if result["Error"]:
        return None, result["Error"]
    passing = result["NodeNames"]
    if not passing:
        return None, "; ".join(sorted({**result["FailedNodes"],
                                       **result["FailedAndUnresolvableNodes"]}.values())[:3])
    best = passing[0]
    if len(passing) > 1:
        scores = {h["Host"]: h["Score"] for h in ext.prioritize(
            {"Pod": pod, "Nodes": None, "NodeNames": passing}).items()}
        best = max(passing, key=lambda n: (scores.get(n, 0), -passing.index(n)))
    meta = pod["metadata"]
    answer = ext.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                       "PodUID": meta["uid"], "Node": best})
    return (None, answer["Error"]) if answer["Error"] else (best, "")
