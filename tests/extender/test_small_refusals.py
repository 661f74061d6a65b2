"""Small holes closed: an isolated GPU takes no new placements, digits other than 0-9 are
no quantities, a binding field that no Kubernetes object could hold is refused by name,
and the fake API server's command answers --help."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from gpupool_testing import ROOT
from lightkube.resources.core_v1 import Node

from gpupool.core.policies import DEFAULT_POLICY
from gpupool.extender.metrics import Metrics
from gpupool.extender.service import Extender, Settings
from gpupool.extender.state.cache import ClusterCache

from .builders import gpu_obj, node_obj, pod_obj


def extender_with(devices: list[dict[str, Any]]) -> Extender:
    cache = ClusterCache()
    cache.sync_nodes([Node.from_dict(node_obj("n0"))])
    cache.sync_devices(devices)
    return Extender(cache, Settings(DEFAULT_POLICY), Metrics())


def isolated(gpu: dict[str, Any]) -> dict[str, Any]:
    gpu["status"]["isolation"] = {"state": "Isolated", "reason": "over its slice", "pods": []}
    return gpu


def test_a_gpu_the_node_agent_isolated_takes_no_new_placements() -> None:
    ext = extender_with([isolated(gpu_obj("n0", 0)), gpu_obj("n0", 1)])
    pod = pod_obj("p", {"gpupool.io/gpu": "2"})
    pod["metadata"]["uid"] = "u1"
    answer = ext.filter({"Pod": pod, "NodeNames": ["n0"]})
    assert answer["NodeNames"] == []
    assert "1 of 2 healthy" in answer["FailedNodes"]["n0"]
    one = pod_obj("q", {"gpupool.io/gpu": "1"})
    one["metadata"]["uid"] = "u2"
    assert ext.filter({"Pod": one, "NodeNames": ["n0"]})["NodeNames"] == ["n0"]


def test_an_isolation_lifted_gives_the_gpu_back() -> None:
    ext = extender_with([isolated(gpu_obj("n0", 0))])
    pod = pod_obj("p", {"gpupool.io/gpu": "1"})
    pod["metadata"]["uid"] = "u1"
    assert ext.filter({"Pod": pod, "NodeNames": ["n0"]})["NodeNames"] == []
    ext.cache.device_event("MODIFIED", gpu_obj("n0", 0))
    assert ext.filter({"Pod": pod, "NodeNames": ["n0"]})["NodeNames"] == ["n0"]


@pytest.mark.parametrize("amount", ["١٠٢٤", "1٠", "１０２４"])
def test_digits_other_than_0_to_9_are_not_a_quantity(amount: str) -> None:
    ext = extender_with([gpu_obj("n0", 0)])
    pod = pod_obj("p", {"gpupool.io/gpu-memory": amount})
    pod["metadata"]["uid"] = "u1"
    answer = ext.filter({"Pod": pod, "NodeNames": ["n0"]})
    assert "is not a Kubernetes quantity" in answer["Error"] and answer["NodeNames"] is None


@pytest.mark.parametrize(("field", "value", "said"), [
    ("PodName", "web\x00", "PodName 'web\\x00' is not a pod name"),
    ("PodName", "a/../../nodes", "is not a pod name"),
    ("PodNamespace", "Team-B", "PodNamespace 'Team-B' is not a namespace name"),
    ("PodNamespace", "x" * 64, "is not a namespace name"),
    ("PodUID", "", "PodUID is missing or empty"),
    ("PodUID", "u\r\nX-Injected: 1", "is not a pod UID"),
    ("Node", "n0?watch=true", "is not a node name"),
    ("Node", 7, "Node 7 is not a node name"),
])
def test_a_binding_field_no_kubernetes_object_could_hold_is_refused_by_name(
        field: str, value: Any, said: str) -> None:
    ext = extender_with([gpu_obj("n0", 0)])
    body: dict[str, Any] = {"PodName": "web", "PodNamespace": "team-b", "PodUID": "u1",
                            "Node": "n0", field: value}
    answer = ext.bind(body)
    assert said in answer["Error"] and "internal error" not in answer["Error"]


def test_the_fake_api_server_command_answers_help_and_names_a_missing_seed() -> None:
    command = [sys.executable, "-m", "gpupool_testing.fake_apiserver"]
    helped = subprocess.run([*command, "--help"], capture_output=True, text=True, cwd=ROOT,
                            timeout=60)
    assert helped.returncode == 0 and "usage:" in helped.stdout
    missing = subprocess.run([*command, "/no/such/seed.jsonl"], capture_output=True, text=True,
                             cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL)
    assert missing.returncode == 2
    assert "cannot load the seed file /no/such/seed.jsonl" in missing.stderr
