"""One ``GPUDevice`` object per physical GPU, kept true by the agent.

``sync`` creates the objects of GPUs it knows, updates spec (identity, memory, make,
links to the other GPUs) and labels when they change, writes status (health, its
level — ``Healthy``, ``Degraded`` or ``Unhealthy`` — and reason, heartbeat, the node's
isolation provider, the GPU's isolation state) every time, and
deletes this node's objects whose GPU the agent no longer knows (garbage
collection). A GPU that vanished while the agent runs stays, ``Unhealthy``
with reason ``vanished``, until the agent restarts without it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpupool.contract import names
from gpupool.contract.devices import links_spec
from gpupool.contract.mig import mig_spec
from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.cluster import InventoryApi
from gpupool.nodeagent.gpu import GpuFacts, GpuInfo

log = logging.getLogger(__name__)

LABEL_NODE = f"{names.GROUP}/node"
LABEL_MODEL = f"{names.GROUP}/model"


def device_name(uuid: str) -> str:
    """The object name of a GPU: ``gpu-`` + its lower-cased uuid (a DNS subdomain)."""
    body = uuid.lower()
    body = body[4:] if body.startswith("gpu-") else body
    return ("gpu-" + re.sub(r"[^a-z0-9.-]+", "-", body)).strip("-.")[:253]


def label_value(text: str) -> str:
    """``text`` made a valid label value (63 characters, alphanumerics and ``-_.``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")


def device_spec(node: str, gpu: GpuInfo, labels: Mapping[str, str] | None = None
                ) -> dict[str, Any]:
    spec = {"node": node, "uuid": gpu.uuid, "index": gpu.index, "model": gpu.model,
            "memoryMiB": gpu.memory_mib, "architecture": gpu.architecture,
            "numaNode": gpu.numa_node, "labels": {**dict(gpu.labels), **(labels or {})},
            **make_spec(gpu.facts)}
    if gpu.links:
        spec["links"] = links_spec(gpu.links)
    if gpu.mig is not None:
        spec["mig"] = mig_spec(gpu.mig)
    return spec


def make_spec(f: GpuFacts) -> dict[str, Any]:
    """The facts NVML reported, under their ``spec`` names (an unknown one is left out)."""
    clocks = {k: v for k, v in (("graphics", f.max_graphics_clock_mhz),
                                ("sm", f.max_sm_clock_mhz),
                                ("memory", f.max_memory_clock_mhz)) if v}
    pcie = {k: v for k, v in (("generation", f.pcie_generation), ("width", f.pcie_width)) if v}
    out = {"computeCapability": f.compute_capability, "maxClocksMHz": clocks,
           "powerLimitW": f.power_limit_w, "pcie": pcie, "driverVersion": f.driver_version,
           "cudaVersion": f.cuda_version}
    return {k: v for k, v in out.items() if v}


def device_status(gpu: GpuInfo, now: datetime, extra: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    return {"health": gpu.health, "healthLevel": gpu.level,
            "reason": gpu.reason or gpu.degraded,
            "heartbeatTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"), **(extra or {})}


def device_object(node: str, gpu: GpuInfo, now: datetime,
                  labels: Mapping[str, str] | None = None,
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION, "kind": "GPUDevice",
        "metadata": {"name": device_name(gpu.uuid),
                     "labels": {LABEL_NODE: node, LABEL_MODEL: label_value(gpu.model)}},
        "spec": device_spec(node, gpu, labels), "status": device_status(gpu, now, extra)}


class Inventory:
    """Publishes the node's GPUs as ``GPUDevice`` objects."""

    def __init__(self, node: str, api: InventoryApi, labels: Mapping[str, str] | None = None,
                 extra_status: Callable[[str], Mapping[str, Any]] = lambda uuid: {}):
        self.node = node
        self.api = api
        self.labels = dict(labels or {})  # added to every GPU's spec.labels
        self.extra_status = extra_status  # GPU uuid -> more status fields

    def sync(self, gpus: Sequence[GpuInfo], now: datetime) -> list[dict[str, Any]]:
        """Make this node's objects match ``gpus``; API errors are logged, the next sync
        retries. Returns the objects as listed before (what others asked of them: the MIG
        layouts, ``nodeagent.mig``); [] when they could not be listed."""
        try:
            listed = self.api.list_devices(self.node)
        except GpupoolError as exc:
            log.warning("cannot list GPUDevices of %s: %s", self.node, exc)
            return []
        existing = {o["metadata"]["name"]: o for o in listed}
        for gpu in gpus:
            self._publish(gpu, existing.pop(device_name(gpu.uuid), None), now)
        for name, obj in existing.items():
            if (obj.get("spec") or {}).get("node") == self.node:
                self._call(self.api.delete_device, name)
        return listed

    def _publish(self, gpu: GpuInfo, current: Mapping[str, Any] | None, now: datetime) -> None:
        name = device_name(gpu.uuid)
        body = device_object(self.node, gpu, now, self.labels, self.extra_status(gpu.uuid))
        if current is None:
            self._call(self.api.create_device, body)
            self._call(self.api.update_device_status, name, body["status"])
            return
        if current.get("spec") != body["spec"] or \
                (current.get("metadata") or {}).get("labels") != body["metadata"]["labels"]:
            meta = {**(current.get("metadata") or {}), "labels": body["metadata"]["labels"]}
            self._call(self.api.replace_device, {**current, "metadata": meta, "spec": body["spec"]})
        self._call(self.api.update_device_status, name, body["status"])

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except GpupoolError as exc:
            log.warning("GPUDevice write failed on %s: %s", self.node, exc)
