"""The node's ResourceSlice: one device per GPU, kept current.

One slice per node, ``<node>-gpu.gpupool.io``, pool = the node's name, one device
``gpu-<index>`` per GPU the agent has seen since it started:

* ``attributes``: ``model``, ``uuid``, ``index``, ``architecture``, ``numaNode`` (and
  ``driverVersion``, ``cudaVersion`` when NVML has them; ``nvlinkClique`` and
  ``pcieSwitch``, the GPU's topology groups for ``matchAttribute``, when its links are
  known: ``topology_groups``) in the driver's own domain, and
  every label a gpupool resource class can select on (``gpupool.io/model``,
  ``gpupool.io/memory``, ``gpupool.io/architecture``, the GPU's own labels, ...) as a
  string attribute named by ``gpupool.contract.dra.label_attribute`` — so a class's
  selector can be written as CEL over them;
* a GPU in MIG mode is no device; each of its MIG devices is one,
  ``gpu-<index>-mig-<profile>-<start>`` (``contract.dra.mig_device_name``), with the
  attributes ``migProfile`` and ``migStart`` besides its GPU's, ``capacity`` its own
  memory and 100 cores, and no ``allowMultipleAllocations``: a claim gets it whole;
* ``capacity``: ``memory`` (whole 256 MiB units by default) and ``cores`` (100), with
  ``allowMultipleAllocations`` and a ``requestPolicy`` in gpupool's accounting units:
  memory from one unit in steps of one unit, cores from 1 in steps of 1; a dimension a
  claim does not ask is consumed whole (``default`` = the capacity);
* an unhealthy GPU (NVML, a vanished GPU, an isolation provider that cannot serve it)
  keeps its device with the taint ``gpu.gpupool.io/unhealthy`` (effect ``NoSchedule``):
  kube-scheduler allocates it to no new claim, the claims it holds stay decodable, and
  their pods keep running. When the API server drops device taints (the
  ``DRADeviceTaints`` feature is off), the device leaves the slice instead;
* a GPU isolated for over-use (``--over-use-action isolate``) gets the taint
  ``gpu.gpupool.io/isolated`` (``NoSchedule``, value ``over-use``) while the over-use
  lasts: no new claim is allocated there, those it holds are untouched. Without device
  taints it stays in the slice (prepare refuses new claims there instead).

``spec.pool.generation`` goes up on every change, so readers never mix two versions.
Quantities are written in the canonical form the API server returns, and the slice is
compared by meaning with what the server has, so an unchanged node writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpupool.contract import dra
from gpupool.core import topology
from gpupool.core.errors import GpupoolError
from gpupool.core.mig import MigDevice
from gpupool.core.topology import PciePath
from gpupool.kube.errors import Conflict, NotFound
from gpupool.nodeagent.dra.claimsource import SliceApi
from gpupool.nodeagent.gpu import GpuInfo

log = logging.getLogger(__name__)
FACTS = 9  # driver-domain attributes a GPU can have (model ... pcieSwitch)
TAINT_ISOLATED = f"{dra.DRIVER}/isolated"
MIG_PROFILE = "migProfile"  # a MIG device's profile (driver-domain attribute)
MIG_START = "migStart"  # its first memory slice


def attributes(gpu: GpuInfo, labels: Mapping[str, str], versions: Mapping[str, str],
               groups: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """A GPU's device attributes: its facts, its topology groups (``topology_groups``),
    then its selector labels (within the limit)."""
    out: dict[str, dict[str, Any]] = {
        "model": {"string": gpu.model[:64]}, "uuid": {"string": gpu.uuid[:64]},
        "index": {"int": gpu.index}, "architecture": {"string": gpu.architecture[:64]},
        "numaNode": {"int": gpu.numa_node}}
    out.update({k: {"string": v[:64]} for k, v in sorted(versions.items()) if v})
    out.update({k: {"string": v} for k, v in sorted((groups or {}).items())})
    if isinstance(gpu.mig, MigDevice):
        out.update({MIG_PROFILE: {"string": gpu.mig.profile},
                    MIG_START: {"int": gpu.mig.start}})
    room = dra.MAX_ATTRIBUTES - 2 - len(out)
    skipped = []
    for key, value in sorted(labels.items()):
        name = dra.label_attribute(key)
        if name is None or len(value) > 64 or room <= 0:
            skipped.append(key)
            continue
        out[f"{name[0]}/{name[1]}"] = {"string": value}
        room -= 1
    if skipped:
        log.debug("GPU %s: labels %s not published as attributes (name, value or count "
                  "beyond Kubernetes' limits)", gpu.uuid, ", ".join(skipped))
    return out


def topology_groups(gpus: Sequence[GpuInfo]) -> dict[str, dict[str, str]]:
    """GPU uuid -> its ``nvlinkClique`` (GPUs NVLink joins two by two) and ``pcieSwitch``
    (GPUs under one PCIe switch) attributes, named after the group's lowest index; none
    when the node's topology is unknown, no ``nvlinkClique`` for a GPU without NVLink."""
    core = [g.to_core() for g in gpus]
    nvlink = topology.cliques(core, lambda link: link.nvlinks > 0)
    switch = topology.cliques(core, lambda link: link.pcie <= PciePath.SWITCH)
    out: dict[str, dict[str, str]] = {}
    for g in gpus:
        mine = out.setdefault(g.uuid, {})
        if g.uuid in switch:
            mine["pcieSwitch"] = f"switch-{switch[g.uuid]}"
        if any(link.nvlinks for _, link in g.links):
            mine["nvlinkClique"] = f"clique-{nvlink[g.uuid]}"
    return out


def capacity(gpu: GpuInfo, memory_unit_mib: int) -> dict[str, Any]:
    memory = dra.binary_quantity(gpu.memory_mib // memory_unit_mib * memory_unit_mib)
    if gpu.mig is not None:  # a MIG device: allocated whole, to one claim
        return {dra.CAPACITY_MEMORY: {"value": memory}, dra.CAPACITY_CORES: {"value": "100"}}
    unit = dra.binary_quantity(memory_unit_mib)
    return {
        dra.CAPACITY_MEMORY: {"value": memory, "requestPolicy": {
            "default": memory, "validRange": {"min": unit, "step": unit, "max": memory}}},
        dra.CAPACITY_CORES: {"value": "100", "requestPolicy": {
            "default": "100", "validRange": {"min": "1", "step": "1", "max": "100"}}},
    }


def taint_value(reason: str) -> str:
    """A reason as a taint value (a label value: 63 characters of ``[A-Za-z0-9_.-]``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", reason)[:63].strip("-_.")


class SlicePublisher:
    """Writes this node's ResourceSlice when what it should say changes."""

    def __init__(self, node: str, api: SliceApi, memory_unit_mib: int = 256,
                 clock: Callable[[], datetime] | None = None):
        self.node = node
        self.api = api
        self.memory_unit_mib = memory_unit_mib
        self.clock = clock
        self.generation = 0
        self.taints_kept = True  # False once the API server dropped device taints
        self.writes = 0
        self._current: dict[str, Any] | None = None  # the slice as the server has it
        self._tainted_at: dict[str, str] = {}  # uuid -> when its taint was added
        self.isolated: Callable[[], set[str]] = set  # GPUs isolated for over-use
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return dra.slice_name(self.node)

    def devices(self, gpus: Sequence[GpuInfo], labels: Callable[[GpuInfo], Mapping[str, str]],
                versions: Mapping[str, str], now: datetime) -> list[dict[str, Any]]:
        out = []
        isolated = self.isolated() if self.taints_kept else set()
        groups = topology_groups(gpus)
        for gpu in sorted(gpus, key=lambda g: g.index):
            name = dra.name_of(gpu.to_core())
            if (not gpu.healthy and not self.taints_kept) or name is None:
                continue  # a GPU in MIG mode is no device: its MIG devices are
            device: dict[str, Any] = {
                "name": name, "allowMultipleAllocations": gpu.mig is None,
                "attributes": attributes(gpu, labels(gpu), versions, groups.get(gpu.uuid)),
                "capacity": capacity(gpu, self.memory_unit_mib)}
            taints = [t for t in (
                self._taint(gpu.uuid, not gpu.healthy, dra.TAINT_UNHEALTHY,
                            taint_value(gpu.reason or "unhealthy"), now),
                self._taint(f"{gpu.uuid}/isolated", gpu.uuid in isolated, TAINT_ISOLATED,
                            "over-use", now)) if t is not None]
            if taints:
                device["taints"] = taints
            out.append(device)
        return out

    def _taint(self, key: str, on: bool, taint: str, value: str, now: datetime
               ) -> dict[str, Any] | None:
        if not on:
            self._tainted_at.pop(key, None)
            return None
        added = self._tainted_at.setdefault(key, now.strftime("%Y-%m-%dT%H:%M:%SZ"))
        return {"key": taint, "effect": "NoSchedule", "value": value, "timeAdded": added}

    def publish(self, gpus: Sequence[GpuInfo], labels: Callable[[GpuInfo], Mapping[str, str]],
                versions: Mapping[str, str], now: datetime) -> bool:
        """Make the slice say ``gpus``; True when it was written. API errors raise."""
        with self._lock:
            if self._current is None:
                self._adopt()
            devices = self.devices(gpus, labels, versions, now)
            if self._current is not None and _devices(self._current) == devices:
                return False
            written = self._write(devices)
            if self.taints_kept and _taints(devices) and not _taints(_devices(written)):
                log.warning("the API server dropped the device taints of unhealthy GPUs "
                            "(DRADeviceTaints is off): unhealthy GPUs leave the ResourceSlice "
                            "instead")
                self.taints_kept = False
                self._write(self.devices(gpus, labels, versions, now))
            return True

    def _adopt(self) -> None:
        """Take over what the server has: our slice (its generation), others removed."""
        for obj in self.api.list_resource_slices(self.node, dra.DRIVER):
            meta = obj.get("metadata") or {}
            if meta.get("name") == self.name:
                self._current = obj
                pool = (obj.get("spec") or {}).get("pool") or {}
                self.generation = int(pool.get("generation") or 0)
            else:
                log.info("deleting stale ResourceSlice %s of %s", meta.get("name"), self.node)
                self._delete(str(meta.get("name")))

    def _delete(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.api.delete_resource_slice(name)

    def _write(self, devices: list[dict[str, Any]]) -> dict[str, Any]:
        self.generation += 1
        body: dict[str, Any] = {
            "apiVersion": dra.API_VERSION, "kind": "ResourceSlice",
            "metadata": {"name": self.name},
            "spec": {"driver": dra.DRIVER, "nodeName": self.node,
                     "pool": {"name": self.node, "generation": self.generation,
                              "resourceSliceCount": 1},
                     "devices": devices}}
        try:
            if self._current is None:
                written = self.api.create_resource_slice(body)
            else:
                body["metadata"]["resourceVersion"] = \
                    (self._current.get("metadata") or {}).get("resourceVersion")
                written = self.api.replace_resource_slice(body)
        except (Conflict, NotFound):
            self._current = None  # someone else wrote or deleted it: adopt again next time
            raise
        except GpupoolError:
            self.generation -= 1
            raise
        self._current = written
        self.writes += 1
        log.info("ResourceSlice %s: generation %d, %d devices", self.name, self.generation,
                 len(devices))
        return written

    def forget(self) -> None:
        """Read the server's slice again before the next write."""
        with self._lock:
            self._current = None


def _devices(obj: Mapping[str, Any]) -> list[Any]:
    return list((obj.get("spec") or {}).get("devices") or [])


def _taints(devices: Sequence[Mapping[str, Any]]) -> bool:
    return any(d.get("taints") for d in devices)
