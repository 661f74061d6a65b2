"""MIG through NVML (nvidia-ml-py's ``pynvml``): listing MIG devices, making and
destroying them.

Listing (``read``, read-only), for one GPU handle:

* ``nvmlDeviceGetMigMode`` -> (current, pending). ``NOT_SUPPORTED`` (a GPU without MIG)
  or ``FUNCTION_NOT_FOUND`` (a driver without MIG): an ordinary GPU. Current mode
  enabled: a GPU in MIG mode. Any other error: counted as in MIG mode with no device
  readable, so that nothing of a GPU gpupool cannot read is handed out;
* its profiles: ``nvmlDeviceGetGpuInstanceProfileInfo(handle, p)`` for every
  ``NVML_GPU_INSTANCE_PROFILE_*`` (its ``id`` and ``name``, e.g. ``MIG 1g.10gb``; profiles
  the GPU lacks answer ``NOT_SUPPORTED`` or ``INVALID_ARGUMENT``);
* its MIG devices: ``nvmlDeviceGetMigDeviceHandleByIndex`` for indexes below
  ``nvmlDeviceGetMaxMigDeviceCount`` (``NOT_FOUND``: no device there), each with
  ``nvmlDeviceGetUUID`` (``MIG-...``), ``nvmlDeviceGetGpuInstanceId``,
  ``nvmlDeviceGetComputeInstanceId``, ``nvmlDeviceGetAttributes`` (memory, SMs, slices)
  and its GPU instance's profile and placement (``nvmlDeviceGetGpuInstanceById``,
  ``nvmlGpuInstanceGetInfo``). A device whose compute instance is smaller than its GPU
  instance, or of a profile gpupool cannot read (``+me``), is left out with a warning:
  it is never handed out.

Making and destroying (``NvmlMigDriver``, what NVIDIA's mig-parted does; never run by
the test suite on a real GPU): ``nvmlDeviceGetComputeRunningProcesses`` on a device
before it is destroyed; ``nvmlDeviceCreateGpuInstanceWithPlacement`` then
``nvmlGpuInstanceCreateComputeInstance`` with the compute-instance profile spanning it
(the placement's size from ``nvmlDeviceGetGpuInstancePossiblePlacements``)
(``nvmlGpuInstanceGetComputeInstanceProfileInfo``, engine profile shared; the GPU
instance is destroyed again if that fails), and ``nvmlGpuInstanceGetComputeInstanceById``
+ ``nvmlComputeInstanceDestroy`` then ``nvmlGpuInstanceDestroy``. NVML's refusals become
``MigError`` with a sentence: ``NO_PERMISSION`` (the agent runs without the privilege
NVML asks for), ``IN_USE`` (a process holds the device), ``INSUFFICIENT_RESOURCES`` (the
placement is taken), ``NOT_SUPPORTED``, ``GPU_IS_LOST``.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any

import pynvml

from gpupool.core import mig
from gpupool.core.errors import InvalidInput
from gpupool.core.mig import MigDevice, MigInstance, MigMode
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.mig import MigError

log = logging.getLogger(__name__)

_ORDINARY = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT,
           pynvml.NVML_ERROR_NOT_FOUND)
_WHY = {
    pynvml.NVML_ERROR_NO_PERMISSION: "NVML refuses: the node agent lacks the privilege to "
                                     "change MIG devices (it needs CAP_SYS_ADMIN)",
    pynvml.NVML_ERROR_IN_USE: "a process still uses the device",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "the placement is taken or the GPU is full",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "the GPU or its driver does not support it",
    pynvml.NVML_ERROR_GPU_IS_LOST: "the GPU is lost (fell off the bus)",
}
_CI_PROFILE = {1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
               2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
               3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
               4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
               7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE}


def read(handle: Any, uuid: str) -> MigMode | None:
    """The GPU's MIG mode and devices (None: an ordinary GPU)."""
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as exc:
        if exc.value in _ORDINARY:
            return None
        log.warning("GPU %s: cannot read its MIG mode (%s); none of it is handed out", uuid,
                    exc)
        return MigMode()
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        if pending == pynvml.NVML_DEVICE_MIG_ENABLE:
            log.warning("GPU %s: MIG mode is pending a GPU reset; served whole until then",
                        uuid)
        return None
    try:
        return MigMode(tuple(_instances(handle, uuid)))
    except pynvml.NVMLError as exc:
        log.warning("GPU %s is in MIG mode but its MIG devices cannot be listed (%s); none "
                    "is handed out", uuid, exc)
        return MigMode()


def profiles(handle: Any) -> dict[int, tuple[str, int]]:
    """NVML's GPU instance profile id -> (profile name, compute slices) of the profiles
    this GPU offers."""
    out = {}
    for p in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, p)
        except pynvml.NVMLError as exc:
            if exc.value in _ABSENT:
                continue
            raise
        out[int(info.id)] = (_name(info.name), int(info.sliceCount))
    return out


def _instances(handle: Any, parent: str) -> list[MigInstance]:
    names = profiles(handle)
    out = []
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                continue
            raise
        found = _instance(handle, device, parent, names)
        if found is not None:
            out.append(found)
    return out


def _instance(handle: Any, device: Any, parent: str, names: dict[int, tuple[str, int]]
              ) -> MigInstance | None:
    uuid = _text(pynvml.nvmlDeviceGetUUID(device))
    gi = int(pynvml.nvmlDeviceGetGpuInstanceId(device))
    ci = int(pynvml.nvmlDeviceGetComputeInstanceId(device))
    attrs = pynvml.nvmlDeviceGetAttributes(device)
    info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(handle, gi))
    name, _ = names.get(int(info.profileId), ("", 0))
    if int(attrs.computeInstanceSliceCount) != int(attrs.gpuInstanceSliceCount):
        log.warning("MIG device %s of GPU %s: its compute instance spans %d of its GPU "
                    "instance's %d slices; gpupool serves whole GPU instances only, so it is "
                    "not handed out", uuid, parent, attrs.computeInstanceSliceCount,
                    attrs.gpuInstanceSliceCount)
        return None
    try:
        where = MigDevice(parent, name, int(info.placement.start), int(info.placement.size),
                          int(attrs.gpuInstanceSliceCount), gi, ci)
    except InvalidInput as exc:
        log.warning("MIG device %s of GPU %s is not one gpupool serves: %s", uuid, parent, exc)
        return None
    return MigInstance(uuid, int(attrs.memorySizeMB), where, int(attrs.multiprocessorCount))


class NvmlMigDriver:
    """Makes and destroys MIG devices through NVML (needs the privilege NVML asks for);
    ``rescan`` has the backend list the GPUs' MIG devices again."""

    def __init__(self, rescan: Callable[[], tuple[GpuInfo, ...]]):
        self.rescan = rescan

    def create(self, gpu: str, profile: str, start: int) -> None:
        handle = _call(f"find GPU {gpu}", pynvml.nvmlDeviceGetHandleByUUID, gpu)
        ids = {name: (pid, slices) for pid, (name, slices) in
               _call(f"list the MIG profiles of GPU {gpu}", profiles, handle).items()}
        if profile not in ids:
            raise MigError(f"GPU {gpu} offers no MIG profile {profile} (it offers "
                           f"{', '.join(sorted(ids)) or 'none'})")
        pid, slices = ids[profile]
        allowed = _call(f"read where {profile} may start on GPU {gpu}", _placements, handle, pid)
        if start not in allowed:
            raise MigError(f"{profile} cannot start at memory slice {start} of GPU {gpu} (NVML "
                           f"allows {', '.join(map(str, sorted(allowed))) or 'no placement'})")
        place = pynvml.c_nvmlGpuInstancePlacement_t(start, allowed[start])
        gi = _call(f"create a {profile} GPU instance at memory slice {start} of GPU {gpu}",
                   pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, handle, pid,
                   ctypes.byref(place))
        try:
            ci = _call(f"read the compute profile of {profile}",
                       pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi,
                       _CI_PROFILE[slices],
                       pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            _call(f"create the compute instance of {profile} on GPU {gpu}",
                  pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci.id)
        except (MigError, KeyError) as exc:
            _call(f"destroy the GPU instance just made on GPU {gpu}", pynvml.nvmlGpuInstanceDestroy,
                  gi)
            raise MigError(str(exc)) from None

    def processes(self, uuid: str) -> list[str]:
        try:
            running = pynvml.nvmlDeviceGetComputeRunningProcesses(
                pynvml.nvmlDeviceGetHandleByUUID(uuid))
        except pynvml.NVMLError as exc:
            return [f"processes not readable ({exc})"]
        return [f"process {p.pid}" for p in running]

    def destroy(self, gpu: str, device: MigDevice) -> None:
        handle = _call(f"find GPU {gpu}", pynvml.nvmlDeviceGetHandleByUUID, gpu)
        what = f"{device.describe()} of GPU {gpu}"
        gi = _call(f"find the GPU instance of {what}", pynvml.nvmlDeviceGetGpuInstanceById,
                   handle, device.gpu_instance)
        ci = _call(f"find the compute instance of {what}",
                   pynvml.nvmlGpuInstanceGetComputeInstanceById, gi, device.compute_instance)
        _call(f"destroy the compute instance of {what}", pynvml.nvmlComputeInstanceDestroy, ci)
        _call(f"destroy the GPU instance of {what}", pynvml.nvmlGpuInstanceDestroy, gi)


def _placements(handle: Any, profile_id: int) -> dict[int, int]:
    """Where NVML lets a GPU instance of the profile start -> the memory slices it spans."""
    places = (pynvml.c_nvmlGpuInstancePlacement_t * mig.MEMORY_SLICES)()
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, places,
                                                      ctypes.byref(count))
    return {int(places[i].start): int(places[i].size) for i in range(count.value)}


def _call(what: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        why = _WHY.get(exc.value, str(exc))
        raise MigError(f"cannot {what}: {why}") from None


def _name(value: Any) -> str:
    text = _text(value)
    return text[4:] if text.startswith("MIG ") else text


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
