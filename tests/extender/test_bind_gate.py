"""Bind acts only on what it may bind, and decides from the pod as the API server has it:
a request body can neither bind someone else's pod nor change what is decided for it."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.contract.annotations import decode

from .builders import Replica, pod_obj, schedule


def bind_body(pod: dict[str, Any], node: str, **changes: str) -> dict[str, str]:
    meta = pod["metadata"]
    body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node}
    body.update(changes)
    return body


def small(fake: FakeApiServer, name: str = "web", **spec: Any) -> dict[str, Any]:
    pod = pod_obj(name, {"gpupool.io/gpu-memory": "1024", "gpupool.io/gpu-core": "5"})
    pod["spec"].update(spec)
    return fake.seed("pods", pod)


def informed(replica: Replica, uid: str, case: str) -> bool:
    """Whether the replica's informer has seen the pod finish or start being deleted."""
    known = replica.cache.unbound.get(uid)
    if known is None:
        return True
    pod = msgspec.to_builtins(known)
    if case == "finished":
        return bool((pod.get("status") or {}).get("phase") == "Succeeded")
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


@pytest.mark.parametrize(("case", "said"), [
    ("another scheduler", "names the scheduler default-scheduler, not gpupool-scheduler"),
    ("no scheduler named", "names the scheduler default-scheduler, not gpupool-scheduler"),
    ("already bound", "is already bound to node n2"),
    ("missing", "pod default/ghost does not exist"),
    ("uid mismatch", "has uid"),
    ("finished", "is Succeeded, not Pending"),
    ("being deleted", "is being deleted"),
])
def test_bind_refuses_a_pod_it_may_not_bind_and_says_why(
        case: str, said: str, fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = small(fake)
    body = bind_body(pod, nodes[0])
    if case == "another scheduler":
        pod = small(fake, schedulerName="default-scheduler")
    elif case == "no scheduler named":  # re-created: a new uid, as the API server gives it
        del pod["spec"]["schedulerName"], pod["metadata"]["uid"]
        pod = fake.seed("pods", pod)
    elif case == "already bound":
        pod = small(fake, nodeName="n2")
    elif case == "missing":
        body = bind_body(pod, nodes[0], PodName="ghost")
    elif case == "uid mismatch":
        body["PodUID"] = "0c7f8a52-5b1e-4c8f-9d0e-1a2b3c4d5e6f"
    elif case == "finished":
        fake.patch_status("pods", "web", {"phase": "Succeeded"}, "default")
    elif case == "being deleted":
        fake.patch("pods", "web", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}},
                   "default")
    body["PodUID"] = pod["metadata"]["uid"] if case != "uid mismatch" else body["PodUID"]
    if case in ("finished", "being deleted"):  # bind reads the informer's copy: let it see
        assert wait_for(lambda: informed(replica, pod["metadata"]["uid"], case))
    answer = replica.extender.bind(body)
    assert said in answer["Error"]
    stored = fake.get("pods", body["PodName"], "default")
    assert stored is None or stored["spec"].get("nodeName") in (None, "n2")
    ledger = fake.get("gpuledgers", nodes[0])
    assert ledger is None or pod["metadata"]["uid"] not in ledger["spec"]["entries"]


@pytest.mark.parametrize("read", ["as bytes", "decoded"])
def test_a_forged_filter_body_does_not_change_the_honest_decision(
        read: str, fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    """The probe's sequence: a filter body with the real pod's uid and resourceVersion but
    forged limits, then kube-scheduler's honest filter + bind of that pod."""
    pod = small(fake)
    assert wait_for(lambda: pod["metadata"]["uid"] in replica.cache.unbound)
    forged = json.loads(json.dumps(pod))
    for kind in ("limits", "requests"):
        forged["spec"]["containers"][0]["resources"][kind] = {"gpupool.io/gpu": "2"}
    ext = replica.extender
    if read == "as bytes":
        for body in (forged, pod):  # the honest filter and prioritize, as the app reads them
            answer = msgspec.json.decode(ext.filter_json(msgspec.json.encode(
                {"Pod": body, "NodeNames": nodes})))
            assert answer["Error"] == ""
        ext.prioritize_json(msgspec.json.encode({"Pod": pod, "NodeNames": nodes}))
    else:
        assert ext.filter({"Pod": forged, "NodeNames": nodes})["Error"] == ""
    node, error = schedule(ext, pod, nodes)
    assert error == "" and node is not None
    notes = fake.get("pods", "web", "default")["metadata"]["annotations"]
    decision = decode(pod["metadata"]["uid"], notes).allocation
    assert not decision.exclusive
    assert [(s.memory_mib, s.core_pct) for s in decision.slices] == [(1024, 5)]


def test_bind_decides_from_the_api_servers_pod_even_when_only_a_forged_body_was_filtered(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = small(fake)
    forged = json.loads(json.dumps(pod))
    forged["spec"]["containers"][0]["resources"]["limits"] = {"gpupool.io/gpu": "2"}
    replica.extender.filter({"Pod": forged, "NodeNames": nodes})
    assert replica.extender.bind(bind_body(pod, nodes[0]))["Error"] == ""
    notes = fake.get("pods", "web", "default")["metadata"]["annotations"]
    assert decode(pod["metadata"]["uid"], notes).allocation.slices[0].memory_mib == 1024


def test_prioritize_does_not_score_a_pod_whose_request_differs_from_what_filter_saw(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = small(fake)
    ext = replica.extender
    assert ext.filter({"Pod": pod, "NodeNames": nodes})["NodeNames"] == nodes
    assert ext.prioritize({"Pod": pod, "NodeNames": nodes}).items()  # scored: it fits
    huge = json.loads(json.dumps(pod))  # the same uid, asking 200 CPUs of 64-CPU nodes
    huge["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "200"
    assert ext.prioritize({"Pod": huge, "NodeNames": nodes}).items() == []


def test_the_same_uid_and_version_with_other_content_is_translated_again(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = small(fake)
    ext = replica.extender
    two = json.loads(json.dumps(pod))
    two["spec"]["containers"][0]["resources"]["limits"] = {"gpupool.io/gpu": "3"}
    assert ext.filter({"Pod": two, "NodeNames": nodes})["NodeNames"] == []  # 2 GPUs a node
    assert ext.filter({"Pod": pod, "NodeNames": nodes})["NodeNames"] == nodes
