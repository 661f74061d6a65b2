"""Every text the extender sends kube-scheduler comes out of Go's ``fmt.Sprintf`` unchanged.

kube-scheduler uses the counted filter reasons (and an extender's ``Error``) as the format
of the pod's FailedScheduling Event (``tests/go_format.py`` says how). So every reason the
extender can produce is produced here through the real verbs — each fit check of the
core (the metric of refused nodes by check proves each one was reached), each refusal of
classes, groups and quota, a node without inventory, malformed and absurd requests, every
rule of bind's gate, every way a bind fails — and run through the Go formatting rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from hypothesis import given
from hypothesis import strategies as st
from lightkube.resources.core_v1 import Node

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.fit import explain
from gpupool.core.model import Gpu
from gpupool.core.model import Node as CoreNode
from gpupool.core.reasons import Check, for_scheduler
from gpupool.core.request import GpuDemand, PodRequest
from gpupool.core.state import ClusterState
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.wire.refusals import CHECKS
from tests.go_format import sprintf

from .builders import Replica, gpu_obj, node_obj, pod_obj

NODES = ["a", "b"]


def survives(text: str) -> bool:
    return sprintf(text) == text


def texts_of(answer: dict[str, Any]) -> list[str]:
    return [answer.get("Error") or "", *answer.get("FailedNodes", {}).values(),
            *answer.get("FailedAndUnresolvableNodes", {}).values()]


@pytest.fixture
def ext() -> Extender:
    """Two nodes of two 40 GiB GPUs, 64 CPUs and 512 GiB; node b's second GPU unhealthy;
    a class that selects no GPU; group g (node a, tenant t, quota of 0 GPUs)."""
    cache = ClusterCache()
    cache.sync_nodes([Node.from_dict(node_obj(n)) for n in NODES])
    cache.sync_devices([gpu_obj("a", 0), gpu_obj("a", 1), gpu_obj("b", 0),
                        gpu_obj("b", 1, health="Unhealthy")])
    cache.class_event("ADDED", {"metadata": {"name": "h100"}, "spec": {"selector": {
        "matchLabels": {"gpupool.io/model": "H100"}}}})
    return Extender(cache, Settings("best-fit"), Metrics())


def hold(ext: Extender, key: str, node: str, slices: tuple[Slice, ...], cpu: int = 0,
         memory: int = 0) -> None:
    with ext.cache.lock:
        assert ext.cache.hold(Allocation(key, node, cpu, memory, slices), "pod")


def filtered(ext: Extender, limits: dict[str, Any], *, ns: str = "default",
             labels: dict[str, str] | None = None, cpu: str = "1", memory: str = "1Gi",
             nodes: list[str] = NODES, annotations: dict[str, str] | None = None) -> list[str]:
    pod = pod_obj("p", limits, ns=ns, labels=labels, cpu=cpu, memory=memory,
                  annotations=annotations)
    pod["metadata"]["uid"] = "uid-p"
    return texts_of(ext.filter({"Pod": pod, "NodeNames": nodes}))


def every_filter_reason(ext: Extender) -> Iterator[str]:
    gpu, mem, core = "gpupool.io/gpu", "gpupool.io/gpu-memory", "gpupool.io/gpu-core"
    yield from filtered(ext, {gpu: "4"})                            # GPU count
    yield from filtered(ext, {mem: "50000"})                        # GPU size
    yield from filtered(ext, {gpu: "2"})                            # health (node b)
    yield from filtered(ext, {gpu: "1"}, cpu="100")                 # CPU: never
    yield from filtered(ext, {gpu: "1"}, memory="600Gi")            # memory: never
    yield from filtered(ext, {"class.gpupool.io/h100": "1"})        # class: no GPU here
    yield from filtered(ext, {"class.gpupool.io/nope": "1"})        # class: unknown
    yield from filtered(ext, {gpu: "1"}, labels={"gpupool.io/group": "nope"})  # group
    yield from filtered(ext, {"mig.gpupool.io/1g.10gb": "1", gpu: "1"})  # MIG profile
    yield from filtered(ext, {"gpupool.io/remote-gpu": "1"},  # remote slices: none here
                        annotations={"gpupool.io/placement": "remote-required"})
    hold(ext, "busy-a0", "a", (Slice("GPU-a-0", 0, 30720, 95),))
    hold(ext, "busy-a1", "a", (Slice("GPU-a-1", 1, 30720, 95),))
    hold(ext, "busy-b0", "b", (Slice("GPU-b-0", 0, 30720, 95),))
    yield from filtered(ext, {mem: "20480", core: "10"})            # GPU free, shared
    yield from filtered(ext, {gpu: "1"})                            # GPU free, idle
    hold(ext, "load-a", "a", (), cpu=63500)
    hold(ext, "load-b", "b", (), memory=523000)
    yield from filtered(ext, {mem: "1024"}, cpu="2")                # CPU: for now (a)
    yield from filtered(ext, {mem: "1024"}, cpu="100m", memory="4Gi")  # memory: for now (b)
    yield from filtered(ext, {gpu: "1"}, nodes=["a", "no-inventory"])
    ext.cache.node_event("ADDED", Node.from_dict(node_obj("d", labels={
        "gpupool.io/node-mode": "dra"})))
    ext.cache.device_event("ADDED", gpu_obj("d", 0))
    yield from filtered(ext, {gpu: "1"}, nodes=["d"])               # node mode: a DRA node
    ext.cache.group_event("ADDED", {"metadata": {"name": "g"}, "spec": {
        "nodes": ["a"], "tenants": ["t"], "quota": {"gpus": 0}}})
    yield from filtered(ext, {mem: "1024"}, ns="t")                 # group quota
    yield from filtered(ext, {mem: "1024"}, ns="t", labels={"gpupool.io/group": "g"})
    yield from filtered(ext, {mem: "1024"}, ns="other")             # tenant with no group
    yield from filtered(ext, {mem: "1024"}, ns="other", labels={"gpupool.io/group": "g"})


def test_every_filter_reason_survives_kube_schedulers_formatting(ext: Extender) -> None:
    texts = [t for t in every_filter_reason(ext) if t]
    assert any("percent" in t for t in texts)  # the sign did occur, written as a word
    assert [t for t in texts if not survives(t)] == []
    reached = {check for check in CHECKS
               if ext.metrics.failures.labels(check)._value.get() > 0}
    # the pod translation never restricts GPU models (groups do, through their mask); a
    # gang member's reasons need the API server (tests/extender/test_gangs.py runs every
    # answer it gets through the same formatting)
    assert reached == set(CHECKS) - {Check.MODEL.value, Check.GANG.value, "other"}


def test_a_model_reason_of_the_core_survives_too() -> None:
    state = ClusterState([CoreNode("n", 1000, 1024, (Gpu("g0", 0, "A100", 40960),))])
    request = PodRequest("p", gpus=(GpuDemand(1, 1024, 10),), models=frozenset({"H100"}))
    reason = explain(state, request, 0)
    assert reason is not None and reason.check is Check.MODEL
    assert survives(for_scheduler(reason.sentence()))


@pytest.mark.parametrize("body", [
    b"{", b"[1, 2]", b'{"Pod": 3, "NodeNames": []}', b'{"Pod": {}, "NodeNames": 7}',
    b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", '
    b'"resources": {"limits": {"gpupool.io/gpu-core": "150"}}}]}}, "NodeNames": ["a"]}',
    b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", '
    b'"resources": {"limits": {"gpupool.io/gpu-memory": "100%"}}}]}}, "NodeNames": ["a"]}',
], ids=["not-json", "not-an-object", "pod-not-an-object", "names-not-a-list",
        "core-over-100-percent", "a-percent-sign-in-a-quantity"])
def test_every_filter_error_survives_kube_schedulers_formatting(ext: Extender, body: bytes
                                                                 ) -> None:
    answer = msgspec.json.decode(ext.filter_json(body))
    assert answer["Error"] and survives(answer["Error"])


def bind(ext: Extender, pod: dict[str, Any], node: str) -> str:
    meta = pod["metadata"]
    error: str = ext.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                           "PodUID": meta["uid"], "Node": node})["Error"]
    return error


def every_bind_error(fake: FakeApiServer, replica: Replica, nodes: list[str]) -> Iterator[str]:
    ext = replica.extender
    yield bind(ext, {"metadata": {"name": "ghost", "namespace": "default", "uid": "u"}},
               nodes[0])                                                    # no such pod
    yield texts_of(ext.bind({"PodName": "a%b", "PodNamespace": "default", "PodUID": "u",
                             "Node": nodes[0]}))[0]                          # malformed
    pod = fake.seed("pods", pod_obj("p", {"gpupool.io/gpu-memory": "1024",
                                          "gpupool.io/gpu-core": "10"}))
    yield bind(ext, {**pod, "metadata": {**pod["metadata"], "uid": "other"}}, nodes[0])
    yield bind(ext, pod, "no-inventory")                                    # unknown node
    fake.fail_next("POST", "binding", 500, "storage at 100% (injected)")
    yield bind(ext, pod, nodes[0])                                          # Binding fails
    fake.fail_next("PATCH", "gpuledgers", 500, "etcd 99% full (injected)")  # made above
    yield bind(ext, pod, nodes[0])                                          # ledger fails
    for _ in range(replica.extender.settings.bind_attempts):
        fake.fail_next("PATCH", "gpuledgers", 409, "conflict at 50%")
    yield bind(ext, pod, nodes[0])                                          # attempts out
    assert ext.binder is not None
    ext.binder.deadline_s = 0.0
    yield bind(ext, pod, nodes[0])                                          # too slow
    ext.binder.deadline_s = 20.0
    big = fake.seed("pods", pod_obj("big", {"gpupool.io/gpu-memory": "40960",
                                            "gpupool.io/gpu-core": "100"}))
    fake.seed("pods", {**pod_obj("sitter", {"gpupool.io/gpu": "2"})})
    sitter = fake.get("pods", "sitter", "default")
    assert sitter is not None and bind(ext, sitter, nodes[1]) == ""
    yield bind(ext, big, nodes[1])                                          # does not fit
    for name, change in (("bound", {"spec": {"nodeName": nodes[2]}}),
                         ("running", {"status": {"phase": "Running"}}),
                         ("elsewhere", {"spec": {"schedulerName": "default-scheduler"}}),
                         ("leaving", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
                                                   "finalizers": ["keep"]}})):
        other = pod_obj(name, {"gpupool.io/gpu": "1"})
        for part, value in change.items():
            other[part] = {**other[part], **value}
        other = fake.seed("pods", other)
        yield bind(ext, other, nodes[0])


def test_every_bind_error_survives_kube_schedulers_formatting(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    errors = list(every_bind_error(fake, replica, nodes))
    assert all(errors), "\n".join(errors)  # every step was refused, as meant
    assert len(set(errors)) == len(errors)  # each a different refusal
    assert any("percent" in e for e in errors)
    assert [e for e in errors if not survives(e)] == []
    assert texts_of(Extender(ClusterCache(), Settings("best-fit"), Metrics()).bind(
        {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "a"}))[0]


@given(st.text(alphabet=st.sampled_from("ab %%%.*[]1#-+0é\t"), max_size=40))
def test_any_text_rendered_for_the_scheduler_survives_and_keeps_its_words(text: str) -> None:
    shown = for_scheduler(text)
    assert "%" not in shown and survives(shown)
    assert shown.replace("percent", "").replace(" ", "").replace("\t", "") == \
        text.replace("%", "").replace(" ", "").replace("\t", "")
