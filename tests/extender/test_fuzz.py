"""Seeded fuzzing of the four verbs: thousands of malformed bodies, each answered in the
verb's own shape (never an exception, never a 500), nothing bound, nothing held, and
correct answers afterwards. The oversized bodies are in ``test_bounded_requests``."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.edge.app import verb_handlers

from .builders import Replica, pod_obj, schedule

CASES = 3000
SEED = 20261124
ODD_VALUES: list[Any] = [None, True, -1, 0, 2**70, 1.5e308, "", "١٠", "\x00", "a\u202eb",
                         "x" * 5000, [], {}, [[[[[]]]]], {"a": {"b": {"c": {}}}}, "-1",
                         "1e400", "NaN", [None] * 50, {"Pod": None}]


def bodies(pod: dict[str, Any], nodes: list[str]) -> dict[str, dict[str, Any]]:
    meta = pod["metadata"]
    return {
        "filter": {"Pod": pod, "Nodes": None, "NodeNames": nodes},
        "prioritize": {"Pod": pod, "Nodes": {"items": [{"metadata": {"name": n}}
                                                       for n in nodes]}, "NodeNames": None},
        "bind": {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                 "PodUID": meta["uid"], "Node": nodes[0]},
        "preempt": {"Pod": pod, "NodeNameToMetaVictims": {
            nodes[0]: {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}}},
    }


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON value."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


def mutated(rng: random.Random, body: dict[str, Any]) -> bytes:
    raw = msgspec.json.encode(body)
    kind = rng.randrange(7)
    if kind == 0:  # cut short
        return raw[:rng.randrange(len(raw))]
    if kind == 1:  # bytes flipped
        data = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if kind == 2:  # junk inserted
        at = rng.randrange(len(raw))
        return raw[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))) + raw[at:]
    if kind == 3:  # one value replaced by an odd one
        return msgspec.json.encode(replaced(body, rng.choice(paths(body)[1:]),
                                            rng.choice(ODD_VALUES)))
    if kind == 4:  # keys in another case, or one dropped
        keys = list(body)
        drop = rng.choice(keys)
        return msgspec.json.encode({(k.upper() if rng.random() < 0.5 else k.lower()): v
                                    for k, v in body.items() if k != drop})
    if kind == 5:  # another top-level type
        return msgspec.json.encode(rng.choice([[body], "body", 7, None, [body, body]]))
    return b"[" * rng.randint(100, 5000) + b"]" * rng.randint(0, 100)  # deep nesting


def well_formed(verb: str, answer: bytes) -> bool:
    value = msgspec.json.decode(answer)
    if verb == "filter":
        return isinstance(value, dict) and isinstance(value.get("Error"), str) and \
            {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes"} <= set(value)
    if verb == "prioritize":
        return isinstance(value, list) and all(set(h) == {"Host", "Score"} for h in value)
    if verb == "bind":
        return isinstance(value, dict) and set(value) == {"Error"}
    return isinstance(value, dict) and isinstance(value.get("NodeNameToMetaVictims"), dict)


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
def test_malformed_bodies_get_answers_in_the_verbs_shape_and_change_nothing(
        verb: str, fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    # a pod of another scheduler: no mutated bind may bind it
    victim = pod_obj("victim", {"gpupool.io/gpu": "1"})
    victim["spec"]["schedulerName"] = "default-scheduler"
    pod = fake.seed("pods", victim)
    handlers = verb_handlers(replica.extender)
    base = bodies(pod, nodes)[verb]
    before = replica.extender.usage_gpus()
    rng = random.Random(f"{SEED}-{verb}")
    for case in range(CASES // 4):
        body = mutated(rng, base)
        answer = handlers[verb](body)
        assert well_formed(verb, answer), f"case {case}: {body[:200]!r} -> {answer[:200]!r}"
    assert replica.extender.usage_gpus() == before
    assert fake.get("pods", "victim", "default")["spec"].get("nodeName") is None
    good = fake.seed("pods", pod_obj("good", {"gpupool.io/gpu": "1"}))
    assert schedule(replica.extender, good, nodes)[1] == ""  # correct answers afterwards
