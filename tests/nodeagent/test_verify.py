"""Only decisions gpupool's scheduler made for that pod are served or counted on the node.

Each attack below is a pod a hostile author could create (any annotation, any
``spec.nodeName``); each is refused with a clear reason, nothing is served, the pod is
marked ``failed`` with ``gpupool.io/reason`` and a ``GpupoolRefused`` Event is recorded,
and none of them makes the agent count a GPU as taken.
"""

from __future__ import annotations

import random
from typing import Any

import grpc
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.kube.api import KubeApi
from gpupool.kube.keystore import KeyRingSource, publish
from gpupool.kube.verifier import DecisionVerifier
from gpupool.nodeagent.pods import pod_from_json
from gpupool.nodeagent.refusals import EVENT_REFUSED
from gpupool.nodeagent.verify import DecisionGate
from gpupool.security.signing import KeyMaterialError, KeyRing, SigningKeys, claims_of

from .builders import KEYS, NAMESPACE, NODE, decision, pod, sign, uuid_of, wait_for
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet, runtime_gpus


def ready(kubelet: FakeKubelet, n: int) -> None:
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == n)


def refused(kubelet: FakeKubelet, p: dict[str, Any]) -> str:
    with pytest.raises(grpc.RpcError) as err:
        kubelet.admit(p, random.Random(1))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return str(err.value.details())


def recorded(api: FakeApiServer, name: str) -> tuple[str, str, list[str]]:
    """(phase, reason, Event messages) the agent left on pod ``name``."""
    obj = api.get("pods", name, "default")
    assert obj is not None
    ann = obj["metadata"]["annotations"]
    events = [e["message"] for e in api.objects("events")
              if e["involvedObject"]["name"] == name and e["reason"] == EVENT_REFUSED]
    return ann.get(names.ANNOTATION_PHASE, ""), ann.get(names.ANNOTATION_REASON, ""), events


WHOLE_GPU = [(uuid_of(0), 0, 16384, 100, "main")]


def forged(name: str, how: str) -> dict[str, Any]:
    """A pod asking 1024 MiB / 10 % that claims a whole GPU, forged ``how``."""
    ann = decision(name, WHOLE_GPU, exclusive=True, keys=None)
    if how == "unknown key":
        ann = sign(ann, name, SigningKeys().added(0.0))
    if how == "copied":  # a valid decision of pod "victim", copied byte for byte
        ann = decision("victim", WHOLE_GPU, exclusive=True)
    if how == "edited":  # signed for 1024 MiB, then one field changed to the whole GPU
        ann = decision(name, [(uuid_of(0), 0, 1024, 10, "main")])
        ann[names.ANNOTATION_ALLOCATION] = ann[names.ANNOTATION_ALLOCATION].replace(
            '"memoryMiB":1024', '"memoryMiB":16384')
    if how == "malformed":
        ann[names.ANNOTATION_SIGNATURE] = "v1.zz.not-a-signature"
    return pod(name, [("main", 1, 1024, 10)], ann=ann)


@pytest.mark.parametrize("how, reason", [
    ("unsigned", "carries no gpupool.io/signature"),
    ("unknown key", "not one of gpupool's published decision keys"),
    ("copied", "does not match it (edited, or copied from another pod)"),
    ("edited", "does not match it (edited, or copied from another pod)"),
    ("malformed", "is not 'v1.<key id>.<signature>'"),
])
def test_a_forged_decision_on_a_pod_with_spec_node_name_is_refused_and_nothing_served(
        how: str, reason: str, kubelet: FakeKubelet, make_agent: AgentFactory,
        apiserver: FakeApiServer) -> None:
    make_agent(gpus=1, split=4)
    ready(kubelet, 4)
    p = forged("attacker", how)
    apiserver.seed("pods", p)  # spec.nodeName set by the author: no scheduler involved
    message = refused(kubelet, p)
    assert "default/attacker" in message and reason in message
    phase, why, events = recorded(apiserver, "attacker")
    assert phase == names.PHASE_FAILED and reason in why
    assert events and reason in events[0]
    after = apiserver.get("pods", "attacker", "default")
    assert after is not None and "gpupool.io/devices" not in after["metadata"]["annotations"]


def test_a_forged_decision_blocks_no_gpu_for_a_real_pod(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=1, split=4)
    ready(kubelet, 4)
    fake = forged("attacker", "unsigned")
    fake["metadata"]["annotations"][names.ANNOTATION_PHASE] = names.PHASE_ALLOCATED
    fake["metadata"]["annotations"]["gpupool.io/devices"] = '{"main":{"vgpu-0000":"x"}}'
    apiserver.seed("pods", fake)
    real = pod("real", [("main", 1, 16384, 100)],
               ann=decision("real", WHOLE_GPU, exclusive=True))
    apiserver.seed("pods", real)
    assert runtime_gpus(kubelet.admit(real, random.Random(3)), "main") == [uuid_of(0)]


def test_a_decision_on_a_cpu_only_pod_is_refused_and_counts_for_nothing(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=1, split=4)
    ready(kubelet, 4)
    cpu_only = pod("cpu-only", [], ann=decision("cpu-only", WHOLE_GPU, exclusive=True))
    cpu_only["spec"]["containers"] = [{"name": "main", "image": "busybox"}]
    cpu_only["metadata"]["annotations"][names.ANNOTATION_PHASE] = names.PHASE_ALLOCATED
    apiserver.seed("pods", cpu_only)
    wait_for(lambda: any(p.name == "cpu-only" for p in agent.pods.node_pods(NODE, False)))
    agent.check_once()  # kubelet never calls Allocate for it: the agent finds it itself
    phase, why, events = recorded(apiserver, "cpu-only")
    assert phase == names.PHASE_FAILED
    assert "none of its containers asks a gpupool GPU resource" in why and events
    real = pod("real", [("main", 1, 16384, 100)], ann=decision("real", WHOLE_GPU,
                                                               exclusive=True))
    apiserver.seed("pods", real)
    assert runtime_gpus(kubelet.admit(real, random.Random(3)), "main") == [uuid_of(0)]


def test_a_pod_without_a_decision_is_refused_unless_the_agent_decides(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=1, split=4)
    ready(kubelet, 4)
    p = pod("plain", [("main", 1, 1024, 10)])
    apiserver.seed("pods", p)
    assert "carries no gpupool decision" in refused(kubelet, p)


def test_with_decide_unscheduled_an_unsigned_decision_is_served(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=1, split=4, decide_unscheduled=True)
    ready(kubelet, 4)
    p = pod("p1", [("main", 1, 1024, 10)],
            ann=decision("p1", [(uuid_of(0), 0, 1024, 10, "main")], keys=None))
    apiserver.seed("pods", p)
    assert runtime_gpus(kubelet.admit(p, random.Random(1)), "main") == [uuid_of(0)]


def test_while_the_keys_cannot_be_read_decisions_are_refused_but_not_marked_by_the_audit(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=1, split=4)
    ready(kubelet, 4)
    apiserver.delete("configmaps", "gpupool-decision-keys", "gpupool-system")
    p = pod("p1", [("main", 1, 1024, 10)],
            ann=decision("p1", [(uuid_of(0), 0, 1024, 10, "main")], keys=SigningKeys().added(0)))
    apiserver.seed("pods", p)
    wait_for(lambda: any(q.name == "p1" for q in agent.pods.node_pods(NODE, False)))
    agent.check_once()
    assert recorded(apiserver, "p1")[0] != names.PHASE_FAILED  # may verify later
    assert "decision keys cannot be read" in refused(kubelet, p)


# -- the gate as a unit -------------------------------------------------------------------------
def ring_verifier(ring: KeyRing, calls: list[str]) -> Any:
    def verify(uid: str, ns: str, name: str, ann: Any, sig: str | None) -> str:
        calls.append(uid)
        return ring.verify(claims_of(uid, ns, name, ann), sig)
    return verify


def test_verification_is_remembered_per_decision_and_signature_never_per_uid() -> None:
    verifier = DecisionVerifier(lambda wanted: KEYS.public())  # what KeyRingSource uses
    gate = DecisionGate(NODE, verifier.verify)
    good = pod_from_json(pod("p1", [("main", 1, 1024, 10)],
                             ann=decision("p1", [(uuid_of(0), 0, 1024, 10, "main")])))
    assert gate.check(good).ok and gate.check(good).ok
    assert (verifier.stats().checked, verifier.stats().remembered) == (1, 1)
    ann = dict(good.annotations)
    ann[names.ANNOTATION_ALLOCATION] = ann[names.ANNOTATION_ALLOCATION].replace("1024", "2048")
    edited = pod_from_json(pod("p1", [("main", 1, 1024, 10)], ann=ann))
    verdict = gate.check(edited)
    assert not verdict.ok and verdict.code == "bad-signature" and verdict.definite


def test_a_retired_key_is_refused_at_once_though_its_decision_was_served() -> None:
    ring = [KEYS.public()]
    gate = DecisionGate(NODE, DecisionVerifier(lambda wanted: ring[0]).verify)
    good = pod_from_json(pod("p1", [("main", 1, 1024, 10)],
                             ann=decision("p1", [(uuid_of(0), 0, 1024, 10, "main")])))
    assert gate.check(good).ok
    ring[0] = KeyRing({})  # the ConfigMap read again without the key
    verdict = gate.check(good)
    assert (verdict.ok, verdict.code) == (False, "unknown-key")


@pytest.mark.parametrize("signature", [
    "", "v1", "v2.0123456789abcdef.AAAA", "v1.0123456789abcdef.!!!!", "v1." + "a" * 300,
    "v1.0123456789abcdef." + "A" * 86, "v1.0123456789ABCDEF.AAAA",
])
def test_malformed_signatures_are_refused_with_a_reason_and_never_raise(signature: str) -> None:
    gate = DecisionGate(NODE, ring_verifier(KEYS.public(), []))
    ann = decision("p1", [(uuid_of(0), 0, 1024, 10, "main")], keys=None)
    ann[names.ANNOTATION_SIGNATURE] = signature
    verdict = gate.check(pod_from_json(pod("p1", [("main", 1, 1024, 10)], ann=ann)))
    assert not verdict.ok and verdict.reason.startswith("pod default/p1")


def test_a_ring_with_a_broken_key_is_refused_as_a_whole() -> None:
    with pytest.raises(KeyMaterialError, match="not a PEM public key"):
        KeyRing.from_data({"0123456789abcdef.pem": "-----BEGIN PUBLIC KEY-----\nxx\n"})


def test_a_broken_published_key_refuses_every_decision_with_the_reason(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=1, split=4)
    ready(kubelet, 4)
    apiserver.patch("configmaps", "gpupool-decision-keys", {"data": {
        "0123456789abcdef.pem": "not a key"}}, "gpupool-system")
    p = pod("p1", [("main", 1, 1024, 10)],
            ann=decision("p1", [(uuid_of(0), 0, 1024, 10, "main")], keys=SigningKeys().added(0)))
    apiserver.seed("pods", p)
    message = refused(kubelet, p)
    assert "decision keys cannot be read" in message and "not a PEM public key" in message


def test_a_key_this_node_has_not_read_is_refused_but_left_to_allocate_by_the_audit() -> None:
    gate = DecisionGate(NODE, ring_verifier(KEYS.public(), []))
    ann = decision("p1", [(uuid_of(0), 0, 1024, 10, "main")], keys=SigningKeys().added(0))
    verdict = gate.check(pod_from_json(pod("p1", [("main", 1, 1024, 10)], ann=ann)))
    assert (verdict.ok, verdict.code, verdict.definite) == (False, "unknown-key", False)


def publish_keys(apiserver: FakeApiServer) -> None:
    """What the extender does when it starts."""
    api = KubeApi.connect(server=apiserver.url)
    try:
        publish(api, NAMESPACE, KEYS)
    finally:
        api.close()


class Waiting:
    """A gate over the keys in the FAKE API server, on a clock that only its sleeps move;
    ``on_sleep`` runs at each sleep (what happens in the cluster meanwhile)."""

    def __init__(self, apiserver: FakeApiServer, on_sleep: Any = None):
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.api = KubeApi.connect(server=apiserver.url)
        keys = KeyRingSource(self.api, NAMESPACE, lambda: self.now)
        self.gate = DecisionGate(NODE, keys.verify, 5.0, self.sleep, lambda: self.now)
        self.on_sleep = on_sleep

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))

    def settled(self) -> Any:
        p = pod_from_json(pod("p1", [("main", 1, 1024, 10)],
                              ann=decision("p1", [(uuid_of(0), 0, 1024, 10, "main")])))
        try:
            return self.gate.settled(p, self.gate.deadline())
        finally:
            self.api.close()


def test_an_allocate_waits_for_keys_being_published_instead_of_refusing(
        apiserver: FakeApiServer) -> None:
    def published_after_a_while(n: int) -> None:
        if n == 12:  # 1.2 s after the Allocate came
            publish_keys(apiserver)

    waiting = Waiting(apiserver, published_after_a_while)
    assert waiting.settled().ok
    assert 1.2 <= sum(waiting.sleeps) <= 2.3  # read again at most a second later


def test_keys_really_absent_are_refused_after_a_short_wait_saying_what_to_do(
        apiserver: FakeApiServer) -> None:
    waiting = Waiting(apiserver)
    verdict = waiting.settled()
    assert (verdict.ok, verdict.code, verdict.definite) == (False, "keys-unavailable", False)
    assert sum(waiting.sleeps) == pytest.approx(5.0)
    assert "ConfigMap gpupool-system/gpupool-decision-keys" in verdict.reason
    assert "check that it runs" in verdict.reason and "re-create the pod" in verdict.reason


def test_a_definite_refusal_is_not_waited_for(apiserver: FakeApiServer) -> None:
    publish_keys(apiserver)
    waiting = Waiting(apiserver)
    p = pod_from_json(forged("attacker", "edited"))
    verdict = waiting.gate.settled(p, waiting.gate.deadline())
    waiting.api.close()
    assert (verdict.ok, verdict.code, waiting.sleeps) == (False, "bad-signature", [])
