"""Remote GPU slices through the extender (FAKE API server, real client and informers):
placement order (own node, then the pod's zone, then any node), one account per GPU for
local and remote slices (two racing replicas included), quotas and preemption counting
remote slices, and the reasons a person reads when a slice cannot be served."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import annotations as records
from gpupool.contract.slices import SliceState, SliceStatus
from gpupool.core.model import Gpu, Node
from gpupool.core.serving import ServingConfig
from gpupool.core.state import ClusterState
from gpupool.extender.preemption.plans import PreemptionSettings
from gpupool.security.signing import claims_of
from tests.rbac_grants import grants, needed, refused, rendered
from tests.waiting import wait_for

from .builders import Replica, gpu_obj, node_obj, pod_obj, schedule

ZONE = "topology.kubernetes.io/zone"
GPUS = {"gpu-a1": "a", "gpu-a2": "a", "gpu-b1": "b"}
CPUS = {"cpu-a": "a", "cpu-b": "b"}
ALL = [*CPUS, *GPUS]
SERVING = ServingConfig(remote=True, domains=(ZONE,))


def seed(fake: FakeApiServer) -> None:
    for name, zone in {**CPUS, **GPUS}.items():
        fake.seed("nodes", node_obj(name, labels={ZONE: zone}))
    for name in GPUS:
        fake.seed("gpudevices", gpu_obj(name, 0))


def in_state(r: Replica) -> int:
    """The nodes in the replica's state, its pending changes applied."""
    with r.cache.lock:
        r.cache.flush()
        return len(r.cache.state.nodes)


@pytest.fixture
def replica(fake: FakeApiServer) -> Iterator[Replica]:
    seed(fake)
    r = Replica(fake, serving=SERVING)
    assert wait_for(lambda: in_state(r) == len(ALL))
    yield r
    r.close()


def remote(name: str, mib: int, ns: str = "default", priority: int | None = None
           ) -> dict[str, Any]:
    """A remote-required pod as the admission webhook leaves it."""
    pod = pod_obj(name, {"gpupool.io/remote-gpu": "1", "gpupool.io/gpu-memory": str(mib)},
                  ns=ns, annotations={"gpupool.io/placement": "remote-required",
                                      "gpupool.io/slice": f"{random.getrandbits(64):016x}"})
    if priority is not None:
        pod["spec"]["priority"] = priority
    return pod


def local(name: str, mib: int, ns: str = "default") -> dict[str, Any]:
    return pod_obj(name, {"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": str(mib)}, ns=ns)


def bind(r: Replica, pod: dict[str, Any], node: str) -> str:
    meta = pod["metadata"]
    assert wait_for(lambda: meta["uid"] in r.cache.unbound)
    answer = r.extender.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                              "PodUID": meta["uid"], "Node": node})
    return str(answer["Error"])


def served_by(fake: FakeApiServer, pod: dict[str, Any]) -> str:
    stored = fake.get("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
    assert stored is not None
    alloc = records.decode(stored["metadata"]["uid"], stored["metadata"]["annotations"])
    return alloc.allocation.served_by


def reasons(answer: dict[str, Any]) -> dict[str, str]:
    return {n: r.removeprefix("gpupool: ") for n, r in
            {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}.items()}


def test_a_slice_is_served_from_the_pods_node_then_its_zone_then_any_node(
        fake: FakeApiServer, replica: Replica) -> None:
    first = fake.seed("pods", remote("first", 30000))
    answer = replica.extender.filter({"Pod": first, "NodeNames": ALL})
    assert sorted(answer["NodeNames"]) == sorted(ALL)  # nodes without GPUs are homes too
    scores = {h["Host"]: h["Score"] for h in replica.extender.prioritize(
        {"Pod": first, "NodeNames": ALL}).items()}
    assert scores == {"gpu-a1": 10, "gpu-a2": 10, "gpu-b1": 10, "cpu-a": 7, "cpu-b": 7}
    assert bind(replica, first, "cpu-a") == ""
    assert served_by(fake, first) in ("gpu-a1", "gpu-a2")  # its zone
    second = fake.seed("pods", remote("second", 30000))
    assert bind(replica, second, "cpu-a") == ""
    assert {served_by(fake, first), served_by(fake, second)} == {"gpu-a1", "gpu-a2"}
    third = fake.seed("pods", remote("third", 30000))
    assert bind(replica, third, "cpu-a") == ""
    assert served_by(fake, third) == "gpu-b1"  # zone a is full: any node
    own = fake.seed("pods", remote("own", 8000))
    assert bind(replica, own, "gpu-a1") == ""
    assert served_by(fake, own) == "gpu-a1"  # a slice server beside the pod
    # each slice is recorded in the ledger of the node that serves it, none on cpu-a
    assert fake.get("gpuledgers", "cpu-a") is None
    entries = (fake.get("gpuledgers", "gpu-b1") or {})["spec"]["entries"]
    assert third["metadata"]["uid"] in entries
    # nothing has room for another 30000 MiB anywhere: every node says why
    fourth = fake.seed("pods", remote("fourth", 30000))
    refused = replica.extender.filter({"Pod": fourth, "NodeNames": ALL})
    assert refused["NodeNames"] == []
    assert reasons(refused)["cpu-a"] == ("1 × (30000 MiB): no room on this node's GPUs nor, "
                                         "as a remote slice, on any other node's")
    error = bind(replica, fourth, "cpu-b")
    assert "own node:" in error and "topology.kubernetes.io/zone=b:" in error


def test_a_local_and_a_remote_slice_never_over_commit_one_gpu(
        fake: FakeApiServer, replica: Replica) -> None:
    mine = fake.seed("pods", local("mine", 30000))
    assert bind(replica, mine, "gpu-a1") == ""
    theirs = fake.seed("pods", remote("theirs", 20000))
    assert bind(replica, theirs, "cpu-a") == ""
    assert served_by(fake, theirs) == "gpu-a2"  # gpu-a1 has 10960 MiB left
    late = fake.seed("pods", local("late", 30000))
    error = bind(replica, late, "gpu-a2")
    assert "node gpu-a2" in error and "have room" in error


def recorded_state(fake: FakeApiServer) -> ClusterState:
    """Every recorded decision reserved into one fresh state (``OverCommit`` if any GPU
    holds more than it has)."""
    nodes = [Node(n, 10**9, 10**9, (Gpu(f"GPU-{n}-0", 0, "A100", 40960),) if n in GPUS
                  else ()) for n in ALL]
    state = ClusterState(nodes)
    for pod in fake.objects("pods"):
        notes = pod["metadata"].get("annotations") or {}
        if pod["spec"].get("nodeName") and records.has_decision(notes):
            state.reserve(records.decode(pod["metadata"]["uid"], notes).allocation)
    return state


def test_two_replicas_racing_local_and_remote_slices_never_over_commit(
        fake: FakeApiServer) -> None:
    seed(fake)
    rng = random.Random(11)
    pods = []
    for k in range(80):
        mib = rng.choice([4096, 8192, 12288])
        pod = remote(f"r{k}", mib) if k % 2 else local(f"l{k}", mib)
        pods.append((fake.seed("pods", pod), rng.choice(ALL if k % 2 else list(GPUS))))
    replicas = [Replica(fake, seed=1, serving=SERVING), Replica(fake, seed=2, serving=SERVING)]
    outcome: dict[str, str] = {}

    def run(r: Replica, mine: list[tuple[dict[str, Any], str]]) -> None:
        assert wait_for(lambda: in_state(r) == len(ALL))
        for pod, node in mine:
            outcome[pod["metadata"]["name"]] = bind(r, pod, node) or node

    try:
        threads = [threading.Thread(target=run, args=(r, pods[k::2]))
                   for k, r in enumerate(replicas)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for r in replicas:
            r.close()
    state = recorded_state(fake)  # raises OverCommit if a GPU was given out twice
    bound = [n for n, o in outcome.items() if o in ALL]
    assert len(bound) >= 10 and any(n.startswith("r") for n in bound)
    assert state.usage().allocated_milli > 0


def test_a_tenant_quota_counts_remote_slices_like_local_ones(
        fake: FakeApiServer, replica: Replica) -> None:
    fake.seed("tenantquotas", {"metadata": {"name": "lab"},
                               "spec": {"namespaces": ["lab"], "limits": {"memoryMiB": 40000}}})
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1)
    first = fake.seed("pods", remote("first", 30000, ns="lab"))
    assert bind(replica, first, "cpu-a") == ""
    again = fake.seed("pods", local("again", 20000, ns="lab"))
    answer = replica.extender.filter({"Pod": again, "NodeNames": list(GPUS)})
    assert answer["NodeNames"] == []
    assert "quota of tenant lab exceeded" in next(iter(reasons(answer).values()))
    also = fake.seed("pods", remote("also", 20000, ns="lab"))
    assert "quota of tenant lab exceeded" in bind(replica, also, "cpu-b")


def test_a_remote_slice_is_a_victim_preemption_can_evict(fake: FakeApiServer) -> None:
    seed(fake)
    r = Replica(fake, serving=SERVING, preemption=PreemptionSettings(hold_s=60.0, retry_s=0.0))
    try:
        assert wait_for(lambda: "budgets" in r.cache.synced and in_state(r) == len(ALL))
        victims = []
        for k, home in enumerate(("cpu-a", "cpu-a", "cpu-b")):
            pod = fake.seed("pods", remote(f"low{k}", 30000, priority=10))
            assert bind(r, pod, home) == ""
            victims.append(pod)
        urgent = local("urgent", 30000)
        urgent["spec"]["priority"] = 1000
        urgent = fake.seed("pods", urgent)
        assert wait_for(lambda: urgent["metadata"]["uid"] in r.cache.unbound)
        assert r.extender.filter({"Pod": urgent, "NodeNames": list(GPUS)})["NodeNames"] == []
        preemptor = r.extender.preemptor
        assert preemptor is not None
        assert wait_for(lambda: not preemptor.planning and not preemptor.inflight)
        gone = [p for p in victims if fake.get("pods", p["metadata"]["name"], "default") is None]
        assert len(gone) == 1  # one remote slice evicted to make the room
        assert wait_for(lambda: gone[0]["metadata"]["uid"] not in r.cache.pods)
        node, error = schedule(r.extender, urgent, list(GPUS))
        assert error == "" and node == served_by_name(gone[0], fake, victims)
    finally:
        r.close()


def served_by_name(gone: dict[str, Any], fake: FakeApiServer, pods: list[dict[str, Any]]
                   ) -> str:
    """The node whose GPU the evicted pod's slice was on: the one the others do not use."""
    used = {served_by(fake, p) for p in pods if p is not gone and
            fake.get("pods", p["metadata"]["name"], "default") is not None}
    (free,) = set(GPUS) - used
    return free


def test_without_remote_slices_on_a_remote_required_pod_is_refused_everywhere(
        fake: FakeApiServer) -> None:
    seed(fake)
    r = Replica(fake)
    try:
        assert wait_for(lambda: in_state(r) == len(GPUS))
        pod = fake.seed("pods", remote("p", 4096))
        answer = r.extender.filter({"Pod": pod, "NodeNames": ALL})
        assert answer["NodeNames"] == [] and not answer["FailedNodes"]
        never = answer["FailedAndUnresolvableNodes"]
        assert set(never) == set(ALL)
        assert never["gpu-a1"] == ("gpupool: remote-required: remote GPU slices are not "
                                   "enabled on this cluster (no data-plane provider)")
    finally:
        r.close()


def lose(fake: FakeApiServer, pod: dict[str, Any], node: str) -> None:
    """What the controller writes when the slice's server on ``node`` stopped answering."""
    status = SliceStatus(SliceState.LOST, node, "gpupool-slices/x", "no answer for 45 s",
                         "2026-01-01T00:00:00Z")
    fake.patch("pods", pod["metadata"]["name"], {"metadata": {"annotations": {
        "gpupool.io/slice-status": status.encode()}}}, pod["metadata"]["namespace"])


def test_a_lost_slice_is_placed_again_on_another_node_with_a_new_signed_decision(
        fake: FakeApiServer, replica: Replica, tmp_path: Path) -> None:
    pod = fake.seed("pods", remote("train", 30000))
    assert bind(replica, pod, "cpu-a") == ""
    before = served_by(fake, pod)
    lose(fake, pod, before)
    uid = pod["metadata"]["uid"]
    assert wait_for(lambda: replica.cache.pods[uid].slice_lost == before)
    replacer = replica.extender.replacer
    assert replacer is not None
    (other,) = {"gpu-a1", "gpu-a2"} - {before}  # the zone's other GPU
    assert replacer.sweep() == {"default/train": other}
    assert served_by(fake, pod) == other
    stored = fake.get("pods", "train", "default")
    notes = stored["metadata"]["annotations"]
    replica.keys.ring().verify(claims_of(uid, "default", "train", notes),
                               notes["gpupool.io/signature"])  # raises if not signed
    assert uid not in ((fake.get("gpuledgers", before) or {}).get("spec", {}).get("entries")
                       or {})
    assert uid in fake.get("gpuledgers", other)["spec"]["entries"]
    assert [e["reason"] for e in fake.objects("events")] == ["GpupoolSlicePlacedAgain"]
    stale = replica.cache.pods[uid]  # the cache may not have seen the move yet
    if stale.decision is not None and stale.decision.served_by == before:
        assert replacer.replace(stale) == f"already served from {other}"
    assert wait_for(lambda: replica.cache.pods[uid].decision.served_by == other)
    assert replacer.sweep() == {}  # the decision moved: nothing is lost any more
    assert served_by(fake, pod) == other
    assert [e["reason"] for e in fake.objects("events")] == ["GpupoolSlicePlacedAgain"]
    rules = grants(rendered(tmp_path, "remote.provider=stub"), "gpupool-extender")
    assert refused(needed(fake.requests), rules) == set()


def test_a_sweep_on_a_cache_that_has_not_seen_the_move_does_not_move_the_slice_again(
        fake: FakeApiServer, replica: Replica) -> None:
    pod = fake.seed("pods", remote("train", 30000))
    assert bind(replica, pod, "cpu-a") == ""
    before = served_by(fake, pod)
    lose(fake, pod, before)
    uid = pod["metadata"]["uid"]
    assert wait_for(lambda: replica.cache.pods[uid].slice_lost == before)
    stale = replica.cache.pods[uid]  # the facts as the first sweep saw them
    replacer = replica.extender.replacer
    assert replacer is not None
    (other,) = {"gpu-a1", "gpu-a2"} - {before}
    assert replacer.replace(stale) == other
    assert replacer.replace(stale) == f"already served from {other}"
    assert served_by(fake, pod) == other
    assert uid in fake.get("gpuledgers", other)["spec"]["entries"]
    assert [e["reason"] for e in fake.objects("events")] == ["GpupoolSlicePlacedAgain"]


def test_a_relabelled_pod_is_placed_again_in_the_group_bind_recorded(
        fake: FakeApiServer, replica: Replica) -> None:
    pod = fake.seed("pods", remote("train", 30000))
    assert bind(replica, pod, "cpu-a") == ""
    before = served_by(fake, pod)
    # its author relabels it into another team's group after the bind
    fake.patch("pods", "train", {"metadata": {"labels": {"gpupool.io/group": "other-team"}}},
               "default")
    lose(fake, pod, before)
    uid = pod["metadata"]["uid"]
    assert wait_for(lambda: replica.cache.pods[uid].slice_lost == before)
    replacer = replica.extender.replacer
    assert replacer is not None
    (other,) = {"gpu-a1", "gpu-a2"} - {before}
    assert replacer.sweep() == {"default/train": other}  # placed as bind placed it
    notes = fake.get("pods", "train", "default")["metadata"]["annotations"]
    assert "gpupool.io/resource-group" not in notes  # charged to no group, as at bind


def test_a_lost_slice_with_no_room_elsewhere_keeps_its_decision_and_says_why(
        fake: FakeApiServer, replica: Replica) -> None:
    pods = [fake.seed("pods", remote(f"p{k}", 30000)) for k in range(3)]
    for pod in pods:
        assert bind(replica, pod, "cpu-b") == ""
    lost = served_by(fake, pods[0])
    lose(fake, pods[0], lost)
    uid = pods[0]["metadata"]["uid"]
    assert wait_for(lambda: replica.cache.pods[uid].slice_lost == lost)
    replacer = replica.extender.replacer
    assert replacer is not None
    (why,) = replacer.sweep().values()
    assert "none of its" in why or "no other node" in why
    assert served_by(fake, pods[0]) == lost
    replacer.sweep()  # the same reason is told once
    assert [e["reason"] for e in fake.objects("events")] == ["GpupoolSliceNotPlacedAgain"]


def allowed(name: str, mib: int, cpu: str = "1") -> dict[str, Any]:
    """A remote-allowed pod as the admission webhook leaves it: its count stays
    ``gpupool.io/gpu``, it has a slice name (its sidecar serves one only if needed)."""
    pod = pod_obj(name, {"gpupool.io/gpu": "1", "gpupool.io/gpu-memory": str(mib)}, cpu=cpu,
                  annotations={"gpupool.io/placement": "remote-allowed",
                               "gpupool.io/slice": f"{random.getrandbits(64):016x}"})
    return pod


def test_a_remote_allowed_pod_is_served_by_its_own_nodes_devices_when_they_have_room(
        fake: FakeApiServer, replica: Replica) -> None:
    pod = fake.seed("pods", allowed("allowed", 8192))
    answer = replica.extender.filter({"Pod": pod, "NodeNames": ALL})
    assert sorted(answer["NodeNames"]) == sorted(GPUS)  # no home without GPUs of its own
    assert reasons(answer)["cpu-a"].startswith("remote-allowed: the pod's GPUs are counted "
                                               "as gpupool.io/gpu devices of its own node")
    assert set(answer["FailedAndUnresolvableNodes"]) == set(CPUS)  # waiting does not help
    scores = {h["Host"]: h["Score"] for h in replica.extender.prioritize(
        {"Pod": pod, "NodeNames": list(GPUS)}).items()}
    assert scores == {"gpu-a1": 10, "gpu-a2": 10, "gpu-b1": 10}  # own node on each
    assert bind(replica, pod, "gpu-b1") == ""
    assert served_by(fake, pod) == ""  # its own node's device: a version-1 decision
    notes = fake.get("pods", "allowed", "default")["metadata"]["annotations"]
    assert '"v":1' in notes["gpupool.io/allocation"]


def test_a_remote_allowed_pod_is_served_from_its_zone_when_its_node_has_no_room(
        fake: FakeApiServer, replica: Replica) -> None:
    full = fake.seed("pods", local("full", 36000))
    assert bind(replica, full, "gpu-a1") == ""
    pod = fake.seed("pods", allowed("allowed", 8192))
    scores = {h["Host"]: h["Score"] for h in replica.extender.prioritize(
        {"Pod": pod, "NodeNames": list(GPUS)}).items()}
    assert scores["gpu-a1"] < scores["gpu-a2"] == scores["gpu-b1"] == 10
    assert bind(replica, pod, "gpu-a1") == ""  # kube-scheduler's choice of home stands
    assert served_by(fake, pod) == "gpu-a2"  # a slice server in its zone
    stored = fake.get("pods", "allowed", "default")
    notes = stored["metadata"]["annotations"]
    assert '"v":2' in notes["gpupool.io/allocation"]
    replica.keys.ring().verify(claims_of(stored["metadata"]["uid"], "default", "allowed", notes),
                               notes["gpupool.io/signature"])  # signed like any decision
    assert pod["metadata"]["uid"] in fake.get("gpuledgers", "gpu-a2")["spec"]["entries"]
    assert recorded_state(fake).usage().allocated_milli > 0  # nothing over-committed


def test_a_remote_allowed_pod_no_node_can_serve_is_filtered_as_a_local_pod(
        fake: FakeApiServer, replica: Replica) -> None:
    for k, node in enumerate(GPUS):
        assert bind(replica, fake.seed("pods", local(f"full{k}", 36000)), node) == ""
    pod = fake.seed("pods", allowed("allowed", 8192))
    answer = replica.extender.filter({"Pod": pod, "NodeNames": list(GPUS)})
    assert answer["NodeNames"] == []
    assert set(answer["FailedNodes"]) == set(GPUS)  # not for ever: preemption may make room
    assert set(reasons(answer).values()) == {
        "1 GPUs with 8192 MiB + 0 percent core needed, 0 have room"}  # its own devices'


def test_a_remote_allowed_slice_placed_again_stays_behind_a_slice_server(
        fake: FakeApiServer, replica: Replica) -> None:
    """Its containers started without a device of their own node: even when its own node
    has room again, the slice is served by a slice server there (servedBy: its node)."""
    full = fake.seed("pods", local("full", 36000))
    assert bind(replica, full, "gpu-a1") == ""
    pod = fake.seed("pods", allowed("allowed", 30000))
    assert bind(replica, pod, "gpu-a1") == ""
    before = served_by(fake, pod)
    assert before in ("gpu-a2", "gpu-b1")
    fake.delete("pods", "full", "default")
    assert wait_for(lambda: full["metadata"]["uid"] not in replica.cache.pods)
    lose(fake, pod, before)
    uid = pod["metadata"]["uid"]
    assert wait_for(lambda: replica.cache.pods[uid].slice_lost == before)
    replacer = replica.extender.replacer
    assert replacer is not None
    assert replacer.sweep() == {"default/allowed": "gpu-a1"}  # its own node first
    assert served_by(fake, pod) == "gpu-a1"  # still a version-2 decision
