"""Everything the node agent writes into a GPUDevice is declared by the CRD, so the API
server keeps it (a structural schema prunes undeclared fields) and the enums hold."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpupool.contract.devices import read_device
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.inventory import device_object

ROOT = Path(__file__).resolve().parents[2]


def schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "charts" / "gpupool" / "crds" / "gpudevices.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def undeclared(value: Any, shape: dict[str, Any], at: str) -> list[str]:
    if isinstance(value, dict):
        props, more = shape.get("properties"), shape.get("additionalProperties")
        out = []
        for k, v in value.items():
            sub = (props or {}).get(k) or (more if isinstance(more, dict) else None)
            out += [f"{at}.{k}"] if sub is None else undeclared(v, sub, f"{at}.{k}")
        return out
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in undeclared(v, shape["items"],
                                                                   f"{at}[{i}]")]
    if "enum" in shape and value not in shape["enum"]:
        return [f"{at}={value!r} not in {shape['enum']}"]
    return []


def test_a_gpu_with_links_make_and_a_degraded_level_fits_the_crd() -> None:
    gpu = FakeGpuBackend(ROOT / "examples" / "boards" / "mixed-dgx1-v100.yaml").discover()[0]
    gpu = replace(gpu, degraded="clocks slowed: HwThermalSlowdown", labels=(("zone", "a"),))
    obj = device_object("node-1", gpu, datetime(2026, 1, 1, tzinfo=UTC),
                        extra={"isolationProvider": "none",
                               "isolation": {"state": "None", "reason": "", "pods": []}})
    assert undeclared(obj["spec"], schema()["properties"]["spec"], "spec") == []
    assert undeclared(obj["status"], schema()["properties"]["status"], "status") == []
    assert obj["status"]["healthLevel"] == "Degraded" and obj["status"]["health"] == "Healthy"
    assert obj["spec"]["computeCapability"] == "7.0" and len(obj["spec"]["links"]) == 7
    read = read_device(obj)
    assert read.reported_healthy and dict(read.gpu.links) == dict(gpu.links)
