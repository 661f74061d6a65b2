"""GPUDevice objects: created, updated, heartbeated and garbage-collected through the API."""

from __future__ import annotations

from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.inventory import device_name

from .builders import NODE, uuid_of, wait_for
from .conftest import AgentFactory


def devices(api: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in api.objects("gpudevices")}


def test_device_names_are_lower_cased_dns_subdomains() -> None:
    assert device_name("GPU-5F2C_ab") == "gpu-5f2c-ab"


def test_one_gpudevice_per_gpu_with_the_agreed_schema(make_agent: AgentFactory,
                                                      apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=2, inventory=True)
    wait_for(lambda: len(devices(apiserver)) == 2
             and all("status" in o and o["status"] for o in devices(apiserver).values()))
    obj = devices(apiserver)[device_name(uuid_of(1))]
    assert obj["metadata"]["labels"] == {"gpupool.io/node": NODE,
                                         "gpupool.io/model": "A100-SXM4-80GB"}
    assert obj["spec"] == {"node": NODE, "uuid": uuid_of(1), "index": 1,
                           "model": "A100-SXM4-80GB", "memoryMiB": 16384,
                           "architecture": "ampere", "numaNode": 1,
                           "labels": {"nvlink": "true", "gpupool.io/isolation-provider": "none"}}
    assert obj["status"]["health"] == "Healthy" and obj["status"]["heartbeatTime"].endswith("Z")
    assert obj["status"]["isolationProvider"] == "none"
    assert obj["status"]["isolation"] == {"state": "None", "reason": "", "pods": []}


def test_health_changes_and_heartbeats_are_published(make_agent: AgentFactory,
                                                     apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=2, split=1, inventory=True, heartbeat_s=0.1)
    name = device_name(uuid_of(0))
    wait_for(lambda: name in devices(apiserver) and devices(apiserver)[name].get("status"))
    first_rv = devices(apiserver)[name]["metadata"]["resourceVersion"]
    wait_for(lambda: devices(apiserver)[name]["metadata"]["resourceVersion"] != first_rv)
    backend = agent.backend
    assert isinstance(backend, FakeGpuBackend)
    backend.set_health(uuid_of(0), False, "XID 79")
    wait_for(lambda: devices(apiserver)[name]["status"]["health"] == "Unhealthy")
    assert devices(apiserver)[name]["status"]["reason"] == "XID 79"
    backend.set_health(uuid_of(0), True)
    wait_for(lambda: devices(apiserver)[name]["status"]["health"] == "Healthy")


def test_stale_objects_of_this_node_are_deleted_and_others_left_alone(
        make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    for node, uuid in ((NODE, "GPU-gone"), ("node-b", "GPU-elsewhere")):
        apiserver.seed("gpudevices", {
            "apiVersion": "gpupool.io/v1alpha1", "kind": "GPUDevice",
            "metadata": {"name": device_name(uuid), "labels": {"gpupool.io/node": node}},
            "spec": {"node": node, "uuid": uuid, "index": 0, "model": "x", "memoryMiB": 1}})
    apiserver.seed("gpudevices", {
        "apiVersion": "gpupool.io/v1alpha1", "kind": "GPUDevice",
        "metadata": {"name": device_name(uuid_of(0)), "labels": {"gpupool.io/node": NODE}},
        "spec": {"node": NODE, "uuid": uuid_of(0), "index": 0, "model": "old", "memoryMiB": 1}})
    make_agent(gpus=1, split=1, inventory=True)
    wait_for(lambda: device_name("GPU-gone") not in devices(apiserver)
             and devices(apiserver)[device_name(uuid_of(0))]["spec"]["model"] != "old")
    assert device_name("GPU-elsewhere") in devices(apiserver)
    assert devices(apiserver)[device_name(uuid_of(0))]["spec"]["memoryMiB"] == 16384


def test_a_vanished_gpu_stays_published_as_unhealthy(make_agent: AgentFactory,
                                                     apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=2, split=1, inventory=True)
    name = device_name(uuid_of(1))
    wait_for(lambda: name in devices(apiserver) and devices(apiserver)[name].get("status"))
    backend = agent.backend
    assert isinstance(backend, FakeGpuBackend)
    backend.set_present(uuid_of(1), False)
    wait_for(lambda: devices(apiserver)[name]["status"]["health"] == "Unhealthy")
    assert devices(apiserver)[name]["status"]["reason"] == "vanished"
