"""The extender gives a multi-GPU pod its node's best-joined GPUs, read from the links the
node agent publishes in GPUDevice ``spec.links`` (the mixed example board)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.contract.annotations import decode
from gpupool.core import topology
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.inventory import device_object

from .builders import Replica, node_obj, pod_obj, schedule

BOARD = Path(__file__).resolve().parents[2] / "examples" / "boards" / "mixed-dgx1-v100.yaml"


def publish(fake: FakeApiServer, links: bool) -> list:  # type: ignore[type-arg]
    gpus = FakeGpuBackend(BOARD).discover()
    fake.seed("nodes", node_obj("dgx"))
    for gpu in gpus:
        obj = device_object("dgx", gpu, datetime.now(UTC))
        if not links:
            del obj["spec"]["links"]
        fake.seed("gpudevices", obj)
    return list(gpus)


def chosen_pair(links: bool) -> tuple[int, int]:
    with FakeApiServer() as fake:
        gpus = publish(fake, links)
        replica = Replica(fake)
        try:
            assert wait_for(lambda: any(n.name == "dgx" and len(n.gpus) == 8
                                        for n in replica.cache.state.nodes))
            pod = fake.seed("pods", pod_obj("pair", {"gpupool.io/gpu": "2"}))
            node, error = schedule(replica.extender, pod, ["dgx"])
            assert (node, error) == ("dgx", "")
            notes = fake.get("pods", "pair", "default")["metadata"]["annotations"]
            slices = decode(pod["metadata"]["uid"], notes).allocation.slices
        finally:
            replica.close()
    index = {g.uuid: g.index for g in gpus}
    a, b = sorted(index[s.gpu_uuid] for s in slices)
    return a, b


def test_a_two_gpu_pod_gets_a_pair_two_nvlinks_join_where_numa_alone_gave_one() -> None:
    gpus = FakeGpuBackend(BOARD).discover()
    best = chosen_pair(links=True)
    assert topology.link_between(gpus[best[0]], gpus[best[1]]).nvlinks == 2
    plain = chosen_pair(links=False)
    assert topology.link_between(gpus[plain[0]], gpus[plain[1]]).nvlinks == 1
