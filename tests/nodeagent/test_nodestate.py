"""NodeView: the kept ClusterState always equals one built afresh from the same pods."""

from __future__ import annotations

import json
import random

import numpy as np

from gpupool.contract import names
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.nodestate import NodeView
from gpupool.nodeagent.pods import ANNOTATION_DEVICES, Pod, pod_from_json

from .builders import NODE, decision, pod, uuid_of


def holding(name: str, gpu: int, core: int) -> Pod:
    ann = decision(name, [(uuid_of(gpu), gpu, 1024, core, "main")])
    ann[names.ANNOTATION_PHASE] = names.PHASE_ALLOCATED
    ann[ANNOTATION_DEVICES] = json.dumps({"main": {f"vgpu-{gpu}": uuid_of(gpu)}})
    obj = pod(name, [("main", 1, 1024, core)], ann=ann)
    obj["metadata"]["resourceVersion"] = "1"
    return pod_from_json(obj)


def test_the_kept_state_matches_a_fresh_one_after_every_change() -> None:
    rng = random.Random(3)
    gpus = [GpuInfo(uuid_of(i), i, "A100", 16384) for i in range(3)]
    kept = NodeView(NODE, 256)
    pods: list[Pod] = []
    for step in range(60):
        if pods and rng.random() < 0.4:
            pods.pop(rng.randrange(len(pods)))
        else:
            pods.append(holding(f"p{step}", rng.randrange(3), rng.choice([2, 5])))
        if rng.random() < 0.1:
            i = rng.randrange(3)
            gpus[i] = GpuInfo(uuid_of(i), i, "A100", 16384, healthy=not gpus[i].healthy)
        skip = rng.choice([p.uid for p in pods] + [""])
        a = kept.state(gpus, pods, skip)
        b = NodeView(NODE, 256).state(gpus, pods, skip)
        assert a.allocations == b.allocations
        assert np.array_equal(a.core_free, b.core_free)
        assert np.array_equal(a.unit_free, b.unit_free)
