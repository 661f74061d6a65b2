"""FAKE MIG: MIG devices described in a fake GPU file, and a fake driver that edits them.

A GPU entry of a fake GPU file (``fakegpus``) with a ``mig`` key is in MIG mode::

    - uuid: GPU-aaaa0000-0000-0000-0000-000000000000
      model: A100-SXM4-80GB
      memoryMiB: 81920
      mig:
        devices:                      # its MIG devices ([]: in MIG mode, none made)
          - {profile: 3g.40gb, start: 4}
          - profile: 1g.10gb
            start: 0
            uuid: MIG-aaaa0000-1g-0   # default: MIG-<GPU uuid without GPU->-<profile>-<start>
            memoryMiB: 9856           # default: the profile's (core.mig)
            smCount: 14               # default 0: not known
            processes: [{pid: 4242}]  # what the driver sees on it (a repartition refuses)
        error: ""                     # fault injection: making or destroying devices fails
                                      # with this NVML error (NoPermission, NotSupported,
                                      # GpuIsLost, InUse, InsufficientResources)

The devices must follow NVIDIA's placement rules for the GPU's model and memory
(``core.mig``); a file that breaks them is refused naming the GPU. ``FakeMigDriver``
makes and destroys devices by rewriting the file (the backend re-reads it), answering as
NVML would: ``InUse`` for a device with processes, ``InsufficientResources`` for a
placement that is taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.contract.yamlcheck import TEXT, WHOLE, Map, Seq
from gpupool.core import mig
from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.mig import MigDevice, MigInstance, MigMode
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.mig import MigError

_PROCESS = Map({"pid": WHOLE, "memoryMiB": WHOLE, "smPct": WHOLE}, required=frozenset({"pid"}))
_DEVICE = Map({"profile": TEXT, "start": WHOLE, "uuid": TEXT, "memoryMiB": WHOLE,
               "gpuInstance": WHOLE, "smCount": WHOLE, "processes": Seq(_PROCESS)},
              required=frozenset({"profile", "start"}))
SHAPE = Map({"devices": Seq(_DEVICE), "error": TEXT})
"""The ``mig`` key of a fake GPU entry."""

ERRORS = {"NoPermission": "NVML refuses: the node agent lacks the privilege to change MIG "
                          "devices (it needs CAP_SYS_ADMIN)",
          "NotSupported": "the GPU or its driver does not support it",
          "GpuIsLost": "the GPU is lost (fell off the bus)",
          "InUse": "a process still uses the device",
          "InsufficientResources": "the placement is taken or the GPU is full"}


def device_uuid(parent: str, profile: str, start: int) -> str:
    """The default uuid of a fake MIG device."""
    body = parent[4:] if parent.startswith("GPU-") else parent
    return f"MIG-{body}-{profile.replace('.', '-')}-{start}"


def read(entry: Mapping[str, Any], parent: str, model: str, memory_mib: int, where: str
         ) -> MigMode | None:
    """A fake GPU entry's MIG mode and devices (None: no ``mig`` key, not in MIG mode)."""
    body = entry.get("mig")
    if body is None:
        return None
    if not isinstance(body, Mapping):
        raise InvalidInput(f"{where}: GPU {parent}: mig must be a mapping")
    geometry = mig.geometry_of(model, memory_mib)
    if geometry is None:
        raise InvalidInput(f"{where}: GPU {parent} ({model}, {memory_mib} MiB) has no MIG "
                           "profiles gpupool knows (A100, H100 80GB, H200); remove its mig key")
    instances = [_instance(d, k, parent, geometry, f"{where}: GPU {parent} mig.devices[{k}]")
                 for k, d in enumerate(body.get("devices") or [])]
    mig.check_layout(geometry, [i.device for i in instances], f"{where}: GPU {parent} mig")
    uuids = [i.uuid for i in instances]
    if len(set(uuids)) != len(uuids):
        raise InvalidInput(f"{where}: GPU {parent}: MIG device uuids must be unique")
    return MigMode(tuple(instances))


def _instance(d: Mapping[str, Any], k: int, parent: str, geometry: mig.MigGeometry,
              where: str) -> MigInstance:
    profile, start = str(d.get("profile")), d.get("start")
    if not isinstance(start, int) or isinstance(start, bool):
        raise InvalidInput(f"{where}: start must be a whole number")
    try:
        device = mig.device_at(geometry, parent, profile, start)
    except (InvalidInput, UnknownName) as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    device = MigDevice(parent, device.profile, device.start, device.size, device.slices,
                       int(d.get("gpuInstance", k + 1)), 0)
    memory = int(d.get("memoryMiB") or geometry.profile(profile).memory_mib)
    uuid = str(d.get("uuid") or device_uuid(parent, profile, start))
    return MigInstance(uuid, memory, device, int(d.get("smCount") or 0))


class FakeMigDriver:
    """FAKE: makes and destroys the MIG devices of a fake GPU file (``FakeGpuBackend``)."""

    def __init__(self, backend: Any):
        self.backend = backend  # a FakeGpuBackend: its file, set_mig and discover

    def rescan(self) -> tuple[GpuInfo, ...]:
        return tuple(self.backend.discover())

    def processes(self, uuid: str) -> list[str]:
        for entry in self.backend.entries():
            for d in (entry.get("mig") or {}).get("devices") or []:
                if self._uuid(entry, d) == uuid:
                    return [f"process {p['pid']}" for p in d.get("processes") or []]
        return []

    def create(self, gpu: str, profile: str, start: int) -> None:
        entry, body = self._gpu(gpu)
        devices = list(body.get("devices") or [])
        taken = [mig.device_at(self._geometry(entry), gpu, str(d["profile"]), int(d["start"]))
                 for d in devices]
        if start not in mig.free_starts(self._geometry(entry), taken, profile):
            raise MigError(f"cannot create a {profile} GPU instance at memory slice {start} of "
                           f"GPU {gpu}: {ERRORS['InsufficientResources']}")
        number = max([int(d.get("gpuInstance", k + 1)) for k, d in enumerate(devices)] + [0]) + 1
        devices.append({"profile": profile, "start": start, "gpuInstance": number})
        self.backend.set_mig(gpu, {**body, "devices": devices})

    def destroy(self, gpu: str, device: MigDevice) -> None:
        _, body = self._gpu(gpu)
        devices = list(body.get("devices") or [])
        match = [d for d in devices if (d.get("profile"), d.get("start")) ==
                 (device.profile, device.start)]
        if not match:
            raise MigError(f"cannot destroy {device.describe()} of GPU {gpu}: NVML lists no "
                           "such device")
        if match[0].get("processes"):
            raise MigError(f"cannot destroy the compute instance of {device.describe()} of "
                           f"GPU {gpu}: {ERRORS['InUse']}")
        devices.remove(match[0])
        self.backend.set_mig(gpu, {**body, "devices": devices})

    def _gpu(self, gpu: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        for entry in self.backend.entries():
            if entry.get("uuid") == gpu:
                body = entry.get("mig")
                if body is None:
                    raise MigError(f"GPU {gpu} is not in MIG mode")
                error = str(body.get("error") or "")
                if error:
                    raise MigError(f"FAKE NVML on GPU {gpu}: {ERRORS.get(error, error)}")
                return entry, body
        raise MigError(f"cannot find GPU {gpu}: FAKE NVML lists no such GPU")

    def _geometry(self, entry: Mapping[str, Any]) -> mig.MigGeometry:
        geometry = mig.geometry_of(str(entry.get("model", "unknown")), int(entry["memoryMiB"]))
        if geometry is None:
            raise MigError(f"GPU {entry.get('uuid')} has no MIG profiles gpupool knows")
        return geometry

    @staticmethod
    def _uuid(entry: Mapping[str, Any], d: Mapping[str, Any]) -> str:
        return str(d.get("uuid") or device_uuid(str(entry["uuid"]), str(d.get("profile")),
                                                int(d.get("start", 0))))
