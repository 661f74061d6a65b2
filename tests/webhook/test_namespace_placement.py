"""A namespace's default and floor for ``gpupool.io/placement`` at admission: a pod that
writes nothing gets the namespace's value exactly as if it had written it; a pod below the
floor is refused naming the namespace; a label that cannot be read, or a namespace that
cannot be read, refuses exactly the pods whose placement depends on it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gpupool.webhook.admission import Settings, mutate, validate
from gpupool.webhook.placement import LABEL_DEFAULT, LABEL_MINIMUM, NamespacePlacement
from gpupool.webhook.review import Verdict, read_review

from .builders import Obj, body, container, gpu_pod, pod, review
from .test_remote import applied, settings

DEFAULT, MINIMUM = LABEL_DEFAULT, LABEL_MINIMUM


def in_namespace(labels: dict[str, str] | None = None, *, unreadable: str = "",
                 provider: str = "stub") -> Settings:
    """Settings whose namespace look-up answers ``labels`` for namespace ``lab`` (and no
    label for any other), or that it cannot read any namespace (``unreadable``)."""
    def lookup(name: str) -> NamespacePlacement:
        if unreadable:
            return NamespacePlacement.unknown(name, unreadable)
        return NamespacePlacement.of_labels(name, (labels or {}) if name == "lab" else {})
    return dataclasses.replace(settings(provider), namespaces=lookup)


def train(placement: str | None = None, ns: str = "lab", **kw: Any) -> Obj:
    notes = {} if placement is None else {"gpupool.io/placement": placement}
    return pod("train", ns, container(limits={"gpupool.io/gpu-memory": "4096",
                                              "gpupool.io/gpu-core": "30"}),
               annotations=notes or None, **kw)


def mutated(obj: Obj, s: Settings) -> Verdict:
    return mutate(read_review(body(review(obj))), s)


def validated(obj: Obj, s: Settings, **kw: Any) -> Verdict:
    return validate(read_review(body(review(obj, **kw))), s)


def admit(obj: Obj, s: Settings) -> tuple[Obj, Verdict]:
    """The pod as mutated, and the validating webhook's verdict on it."""
    verdict = mutated(obj, s)
    assert verdict.allowed, verdict.message
    out = applied(obj, verdict)
    return out, validated(out, s)


# -- the default ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["remote-required", "remote-allowed", "local"])
def test_a_pod_that_says_nothing_is_admitted_exactly_as_one_that_wrote_the_default(
        value: str) -> None:
    said, said_verdict = admit(train(value), in_namespace({DEFAULT: value}))
    silent, silent_verdict = admit(train(), in_namespace({DEFAULT: value}))
    assert said_verdict.allowed and silent_verdict.allowed, silent_verdict.message
    assert silent == said
    assert silent["metadata"]["annotations"]["gpupool.io/placement"] == value


def test_the_default_is_written_beside_annotations_the_pod_already_has() -> None:
    obj = train()
    obj["metadata"]["annotations"] = {"gpupool.io/mode": "shared", "team": "a"}
    out, verdict = admit(obj, in_namespace({DEFAULT: "remote-required"}))
    assert verdict.allowed, verdict.message
    assert {k: v for k, v in out["metadata"]["annotations"].items()
            if k != "gpupool.io/slice"} == {"gpupool.io/mode": "shared", "team": "a",
                                            "gpupool.io/placement": "remote-required"}


def test_an_empty_annotation_says_nothing_and_gets_the_default() -> None:
    out, verdict = admit(train(""), in_namespace({DEFAULT: "remote-required"}))
    assert verdict.allowed, verdict.message
    assert out["metadata"]["annotations"]["gpupool.io/placement"] == "remote-required"


def test_a_pod_that_writes_its_own_value_keeps_it_where_there_is_no_floor() -> None:
    out, verdict = admit(train("local"), in_namespace({DEFAULT: "remote-required"}))
    assert verdict.allowed, verdict.message
    assert out["metadata"]["annotations"] == {"gpupool.io/placement": "local"}
    assert "initContainers" not in out["spec"]


def test_a_default_remote_required_pod_is_refused_as_one_that_wrote_it_would_be() -> None:
    """Remote slices are one GPU per pod: a two-GPU pod that says nothing is refused with the
    same reason as one that wrote remote-required."""
    two = train()
    two["spec"]["containers"][0]["resources"]["limits"]["gpupool.io/gpu"] = "2"
    wrote = train("remote-required")
    wrote["spec"]["containers"][0]["resources"]["limits"]["gpupool.io/gpu"] = "2"
    s = in_namespace({DEFAULT: "remote-required"})
    silent, said = mutated(two, s), mutated(wrote, s)
    assert not silent.allowed
    assert (silent.message, silent.code) == (said.message, said.code)


def test_without_a_provider_a_default_remote_required_pod_is_refused_with_that_reason() -> None:
    verdict = mutated(train(), in_namespace({DEFAULT: "remote-required"}, provider="none"))
    assert not verdict.allowed
    assert "remote GPU slices are not enabled on this cluster" in verdict.message


def test_a_pod_that_asks_no_gpu_is_not_touched_by_its_namespace() -> None:
    plain = pod("web", "lab", container())
    for s in (in_namespace({DEFAULT: "remote-required", MINIMUM: "remote-required"}),
              in_namespace(unreadable="connection refused")):
        assert mutated(plain, s) == Verdict.allow()
        assert validated(plain, s).allowed


# -- the floor --------------------------------------------------------------------------------
@pytest.mark.parametrize(("asked", "floor"), [
    ("local", "remote-allowed"), ("local", "remote-required"),
    ("remote-allowed", "remote-required"), (" LOCAL ", "remote-allowed")])
def test_a_pod_below_its_namespaces_floor_is_refused_naming_the_namespace(
        asked: str, floor: str) -> None:
    s = in_namespace({MINIMUM: floor})
    for verdict in (mutated(train(asked), s), validated(train(asked), s)):
        assert not verdict.allowed
        assert (verdict.code, verdict.reason) == (403, "Forbidden")
        assert verdict.message.startswith(
            f"pod lab/train: gpupool.io/placement={asked.strip().lower()} is below the "
            f"minimum of namespace lab, {floor} (its label {MINIMUM}, set by the cluster's "
            "administrators): write ")


@pytest.mark.parametrize(("asked", "floor"), [
    ("remote-allowed", "remote-allowed"), ("remote-required", "remote-allowed"),
    ("remote-required", "remote-required"), ("local", "local")])
def test_a_pod_at_or_above_the_floor_is_admitted_as_written(asked: str, floor: str) -> None:
    out, verdict = admit(train(asked), in_namespace({MINIMUM: floor}))
    assert verdict.allowed, verdict.message
    assert out["metadata"]["annotations"]["gpupool.io/placement"] == asked


def test_a_pod_that_says_nothing_is_raised_to_the_floor_when_there_is_no_default() -> None:
    said, _ = admit(train("remote-allowed"), in_namespace({MINIMUM: "remote-allowed"}))
    silent, verdict = admit(train(), in_namespace({MINIMUM: "remote-allowed"}))
    assert verdict.allowed, verdict.message
    assert silent == said


def test_the_default_wins_over_the_floor_for_a_pod_that_says_nothing() -> None:
    out, verdict = admit(train(), in_namespace({DEFAULT: "remote-required",
                                                MINIMUM: "remote-allowed"}))
    assert verdict.allowed, verdict.message
    assert out["metadata"]["annotations"]["gpupool.io/placement"] == "remote-required"


def test_a_default_below_the_floor_refuses_the_pods_that_take_it_naming_both_labels() -> None:
    s = in_namespace({DEFAULT: "local", MINIMUM: "remote-allowed"})
    verdict = mutated(train(), s)
    assert not verdict.allowed
    assert verdict.message.startswith(
        f"pod lab/train: namespace lab's default placement local (its label {DEFAULT}) is "
        f"below its minimum remote-allowed (its label {MINIMUM})")
    assert admit(train("remote-allowed"), s)[1].allowed


def test_the_floor_is_checked_again_on_the_pod_as_the_mutations_left_it() -> None:
    """Another mutating webhook after gpupool's removes the annotation the default wrote:
    the validating webhook reads the pod as local, below the floor."""
    s = in_namespace({DEFAULT: "remote-allowed", MINIMUM: "remote-allowed"})
    out, _ = admit(train(), s)
    del out["metadata"]["annotations"]["gpupool.io/placement"]
    verdict = validated(out, s)
    assert not verdict.allowed
    assert "writes no gpupool.io/placement (read as local), which is below the minimum of " \
           "namespace lab, remote-allowed" in verdict.message


def test_the_namespace_is_the_requests_not_the_one_the_object_names() -> None:
    obj = train("local")
    obj["metadata"]["namespace"] = "elsewhere"
    verdict = validate(read_review(body(review(obj, namespace="lab"))),
                       in_namespace({MINIMUM: "remote-required"}))
    assert not verdict.allowed and "namespace lab" in verdict.message


def test_an_unbound_pod_may_not_be_edited_below_the_floor() -> None:
    s = in_namespace({MINIMUM: "remote-allowed"})
    before, _ = admit(train("remote-allowed"), s)
    after = json.loads(json.dumps(before))
    after["metadata"]["annotations"]["gpupool.io/placement"] = "local"
    for sub in ("", "status"):
        verdict = validated(after, s, operation="UPDATE", old=before, sub=sub)
        assert not verdict.allowed
        assert "is below the minimum of namespace lab, remote-allowed" in verdict.message
    removed = json.loads(json.dumps(before))
    del removed["metadata"]["annotations"]["gpupool.io/placement"]
    assert not validated(removed, s, operation="UPDATE", old=before).allowed
    raised = json.loads(json.dumps(before))
    raised["metadata"]["annotations"]["gpupool.io/placement"] = "remote-required"
    assert validated(raised, s, operation="UPDATE", old=before).allowed


def test_a_pod_from_before_the_floor_may_still_be_updated_where_placement_is_unchanged(
        ) -> None:
    old = train("local")
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"]["gpupool.io/healing"] = "off"
    new["metadata"]["labels"] = {"app": "x"}
    verdict = validated(new, in_namespace({MINIMUM: "remote-required"}), operation="UPDATE",
                        old=old)
    assert verdict.allowed, verdict.message


# -- labels that cannot be read ---------------------------------------------------------------
def test_a_malformed_floor_refuses_every_pod_it_could_concern() -> None:
    s = in_namespace({MINIMUM: "remote"})
    for asked in (None, "local", "remote-allowed"):
        verdict = mutated(train(asked), s)
        assert not verdict.allowed
        assert verdict.message.startswith(
            f"pod lab/train: namespace lab's label {MINIMUM}='remote' is not a placement "
            "(local, remote-allowed, remote-required)")
        assert not validated(train(asked), s).allowed
    assert admit(train("remote-required"), s)[1].allowed  # nothing is above it


def test_a_malformed_default_refuses_only_the_pods_that_would_take_it() -> None:
    s = in_namespace({DEFAULT: "Remote_Required"})
    verdict = mutated(train(), s)
    assert not verdict.allowed
    assert verdict.message.startswith(
        f"pod lab/train: namespace lab's label {DEFAULT}='Remote_Required' is not a placement")
    assert "or write gpupool.io/placement on the pod" in verdict.message
    for asked in ("local", "remote-allowed", "remote-required"):
        assert admit(train(asked), s)[1].allowed


def test_label_values_are_read_as_the_pod_annotation_is() -> None:
    out, verdict = admit(train(), in_namespace({DEFAULT: "Remote-Required"}))
    assert verdict.allowed, verdict.message
    assert out["metadata"]["annotations"]["gpupool.io/placement"] == "remote-required"


# -- a namespace that cannot be read ----------------------------------------------------------
def test_an_unreadable_namespace_refuses_the_pods_whose_placement_depends_on_it() -> None:
    s = in_namespace(unreadable="get namespace lab: connection refused")
    for asked in (None, "local", "remote-allowed"):
        for verdict in (mutated(train(asked), s), validated(train(asked), s)):
            assert not verdict.allowed
            assert (verdict.code, verdict.reason) == (503, "ServiceUnavailable")
            assert verdict.message.startswith(
                "pod lab/train: gpupool cannot read namespace lab (get namespace lab: "
                f"connection refused), whose labels {DEFAULT} and {MINIMUM} may set this "
                "pod's placement")
    assert admit(train("remote-required"), s)[1].allowed


# -- nothing set changes nothing --------------------------------------------------------------
CASES = [
    gpu_pod("p", "lab"), train(), train("local"), train("remote-allowed"),
    train("remote-required"), train("remote"), gpu_pod("p", "lab", scheduler="other"),
    pod("web", "lab", container()),
]


@pytest.mark.parametrize("obj", CASES, ids=range(len(CASES)))
def test_a_namespace_with_nothing_set_changes_no_verdict(obj: Obj) -> None:
    for labels in ({}, {"team": "a", "tenant.gpupool.io/team": "a"}):
        with_ns, without = in_namespace(labels), settings()
        assert mutated(obj, with_ns) == mutated(obj, without)
        assert validated(obj, with_ns) == validated(obj, without)


# -- the shipped configurations send every request a namespace setting concerns -------------
def test_the_webhook_configurations_send_the_pods_a_namespace_setting_concerns() -> None:
    from .cel import conditions
    from .test_deploy import HOOKS, MUTATING

    s = in_namespace({DEFAULT: "remote-allowed", MINIMUM: "remote-allowed"})
    silent = review(train())
    assert mutated(train(), s).patch
    assert conditions(MUTATING, silent["request"]) is True
    below = review(train("local"))
    assert not validated(train("local"), s).allowed
    assert conditions(HOOKS["pods.validate.gpupool.io"], below["request"]) is True
    before = train("remote-allowed")
    edited = review(train("local"), operation="UPDATE", old=before)
    assert not validate(read_review(body(edited)), s).allowed
    assert conditions(HOOKS["pods.validate.gpupool.io"], edited["request"]) is True
