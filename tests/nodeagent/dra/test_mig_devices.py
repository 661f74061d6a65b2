"""MIG devices on a DRA node: each a whole device of the ResourceSlice, its GPU none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import dra
from gpupool.core.mig import MigDevice, MigMode
from gpupool.core.model import Gpu
from gpupool.nodeagent.fakemig import device_uuid

from ..builders import NODE, uuid_of
from .conftest import DraFactory

GPU0 = uuid_of(0)


def board(path: Path) -> None:
    gpus: list[dict[str, Any]] = [
        {"uuid": GPU0, "model": "A100-SXM4-80GB", "memoryMiB": 81920, "architecture": "ampere",
         "mig": {"devices": [{"profile": "3g.40gb", "start": 0},
                             {"profile": "1g.10gb", "start": 4}]}},
        {"uuid": uuid_of(1), "model": "A100-SXM4-80GB", "memoryMiB": 81920, "index": 1}]
    path.write_text(yaml.safe_dump({"gpus": gpus}, sort_keys=False))


def test_a_gpu_in_mig_mode_publishes_its_mig_devices_whole_and_not_itself(
        make_dra: DraFactory, apiserver: FakeApiServer, short_dir: Path) -> None:
    board(short_dir / "gpus.yaml")
    agent = make_dra(write=False)
    assert agent.published.wait(30)
    obj = apiserver.get("resourceslices", dra.slice_name(NODE))
    assert obj is not None
    devices = {d["name"]: d for d in obj["spec"]["devices"]}
    assert sorted(devices) == ["gpu-0-mig-1g-10gb-4", "gpu-0-mig-3g-40gb-0", "gpu-1"]
    three = devices["gpu-0-mig-3g-40gb-0"]
    assert three["allowMultipleAllocations"] is False
    assert three["capacity"] == {"memory": {"value": "40Gi"}, "cores": {"value": "100"}}
    assert three["attributes"]["migProfile"] == {"string": "3g.40gb"}
    assert three["attributes"]["migStart"] == {"int": 0}
    assert three["attributes"]["uuid"] == {"string": device_uuid(GPU0, "3g.40gb", 0)}
    assert devices["gpu-1"]["allowMultipleAllocations"] is True
    table, problems = dra.device_table([obj])
    assert problems == []
    claim = {"metadata": {"uid": "c1", "namespace": "ns", "name": "c"},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                 "deviceClassName": "mig.gpupool.io"}}]}},
             "status": {"allocation": {"devices": {"results": [
                 {"driver": dra.DRIVER, "pool": NODE, "device": "gpu-0-mig-1g-10gb-4",
                  "request": "r"}]}}}}
    holding = dra.read_claim(claim, table)
    assert holding is not None and holding.exclusive
    assert holding.gpus[0].device.uuid == device_uuid(GPU0, "1g.10gb", 4)


def test_the_extender_s_table_from_gpudevices_names_mig_devices_as_the_agent_does() -> None:
    parent = Gpu(GPU0, 0, "A100-SXM4-80GB", 81920, mig=MigMode())
    device = Gpu("MIG-x", 0, "A100-SXM4-80GB", 10240, mig=MigDevice(GPU0, "1g.10gb", 4, 1, 1))
    table = dra.devices_of_node(NODE, [parent, device], 256)
    assert list(table) == [(NODE, "gpu-0-mig-1g-10gb-4")]
    assert table[NODE, "gpu-0-mig-1g-10gb-4"].uuid == "MIG-x"
