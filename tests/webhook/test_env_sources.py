"""Environment a pod takes from elsewhere (``valueFrom``, ``envFrom``), over real HTTPS: its
value is not known at admission, so a guarded variable given that way is refused."""

from __future__ import annotations

from typing import Any

import pytest

from .builders import body, container, pod, review
from .cel import conditions
from .conftest import Webhook
from .test_deploy import HOOKS

SOURCES: list[dict[str, Any]] = [
    {"configMapKeyRef": {"name": "settings", "key": "gpus"}},
    {"secretKeyRef": {"name": "settings", "key": "gpus"}},
    {"fieldRef": {"fieldPath": "metadata.annotations['gpus']"}},
    {"resourceFieldRef": {"resource": "limits.cpu"}},  # "1": GPU index 1
]


def _from(variable: str, source: dict[str, Any], **kw: Any) -> dict[str, Any]:
    c = container(**kw)
    c["env"] = [*c.get("env", []), {"name": variable, "valueFrom": source}]
    return c


def _denied(webhook: Webhook, obj: dict[str, Any], words: str, **kw: Any) -> None:
    request_review = review(obj, **kw)
    status, out = webhook.post("/validate", body(request_review))
    assert status == 200 and out["response"]["allowed"] is False, out
    assert words in out["response"]["status"]["message"]
    assert conditions(HOOKS["pods.validate.gpupool.io"], request_review["request"]) is True


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: next(iter(s)))
def test_a_cpu_pod_setting_nvidia_visible_devices_through_value_from_is_denied(
        webhook: Webhook, source: dict[str, Any]) -> None:
    kind = next(iter(source))
    words = f"sets NVIDIA_VISIBLE_DEVICES through valueFrom.{kind} without asking a GPU"
    _denied(webhook, pod("p", "team-a", _from("NVIDIA_VISIBLE_DEVICES", source)), words)
    _denied(webhook, pod("p", "team-a", container(),
                         init=[_from("NVIDIA_VISIBLE_DEVICES", source, name="setup")]),
            f"init container setup {words}")


def test_an_ephemeral_container_of_a_cpu_pod_may_not_either(webhook: Webhook) -> None:
    old = pod("p", "team-a", node="n1")
    debug = _from("NVIDIA_VISIBLE_DEVICES", SOURCES[0], name="debug")
    new = pod("p", "team-a", node="n1", ephemeral=[debug])
    _denied(webhook, new, "ephemeral container debug sets NVIDIA_VISIBLE_DEVICES through "
            "valueFrom", operation="UPDATE", old=old, sub="ephemeralcontainers")


@pytest.mark.parametrize("name", ["NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                  "CUDA_DEVICE_MEMORY_LIMIT_0", "LD_PRELOAD"])
@pytest.mark.parametrize("source", SOURCES[:2], ids=lambda s: next(iter(s)))
def test_a_gpu_pod_setting_a_guarded_variable_through_value_from_is_denied(
        webhook: Webhook, name: str, source: dict[str, Any]) -> None:
    c = _from(name, source, limits={"gpupool.io/gpu-memory": "1024"})
    _denied(webhook, pod("p", "team-a", c), f"container main sets {name}")


def test_a_cpu_pod_hiding_gpus_by_value_or_taking_other_variables_from_elsewhere_is_allowed(
        webhook: Webhook) -> None:
    c = _from("APP_GPUS", SOURCES[0], env={"NVIDIA_VISIBLE_DEVICES": "void"})
    status, out = webhook.post("/validate", body(review(pod("p", "team-a", c))))
    assert status == 200 and out["response"]["allowed"] is True
