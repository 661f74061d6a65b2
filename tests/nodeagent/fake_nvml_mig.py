"""FAKE libnvidia-ml's MIG calls behind pynvml's functions (NVIDIA's A100 80GB geometry).

Only the C library is replaced: answers are pynvml's own ctypes structures and errors
its own exception classes. GPUs are handles ``h<i>`` (as ``fake_nvml.FakeNvml`` names
them; this fake may sit on top of it: ``nvmlDeviceGetUUID`` and
``nvmlDeviceGetHandleByUUID`` fall through to whatever answered before for GPU handles).
MIG device handles are ``m<i>:<gpu instance id>``, GPU instances ``gi<i>:<id>``, compute
instances ``ci<i>:<gi>:<id>``. ``fail(function, error)`` makes a function answer an NVML
error; ``calls`` records every call with its arguments.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from gpupool.core.mig import by_name

A100_80GB = by_name("A100-80GB")

# NVML profile enum index -> (profile id as nvidia-smi shows it, name, compute slices, size)
PROFILES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, "MIG 1g.10gb", 1, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (20, "MIG 1g.10gb+me", 1, 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, "MIG 1g.20gb", 1, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, "MIG 2g.20gb", 2, 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, "MIG 3g.40gb", 3, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, "MIG 4g.40gb", 4, 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, "MIG 7g.80gb", 7, 8),
}
BY_ID = {pid: (name, slices, size) for pid, name, slices, size in PROFILES.values()}


@dataclass
class Instance:
    profile_id: int
    start: int
    ci: int = 0
    ci_slices: int = 0  # 0: spans the GPU instance
    processes: list[int] = field(default_factory=list)


@dataclass
class FakeGpu:
    uuid: str
    mode: tuple[int, int] = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
    instances: dict[int, Instance] = field(default_factory=dict)


class FakeMigNvml:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]):
        self.gpus = gpus
        self.errors: dict[str, int] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        before_uuid = pynvml.nvmlDeviceGetUUID
        before_mode = pynvml.nvmlDeviceGetMigMode
        before_by_uuid = pynvml.nvmlDeviceGetHandleByUUID
        functions: dict[str, Callable[..., Any]] = {
            "nvmlDeviceGetMigMode": lambda h: self._mode(h, before_mode),
            "nvmlDeviceGetGpuInstancePossiblePlacements": self._placements,
            "nvmlDeviceGetGpuInstanceProfileInfo": self._profile_info,
            "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
            "nvmlDeviceGetMigDeviceHandleByIndex": self._mig_handle,
            "nvmlDeviceGetUUID": lambda h: self._uuid(h, before_uuid),
            "nvmlDeviceGetHandleByUUID": lambda u: self._by_uuid(u, before_by_uuid),
            "nvmlDeviceGetGpuInstanceId": lambda m: int(m.split(":")[1]),
            "nvmlDeviceGetComputeInstanceId": lambda m: self._instance(m).ci,
            "nvmlDeviceGetAttributes": self._attributes,
            "nvmlDeviceGetGpuInstanceById": self._gi_by_id,
            "nvmlGpuInstanceGetInfo": self._gi_info,
            "nvmlDeviceCreateGpuInstanceWithPlacement": self._create_gi,
            "nvmlGpuInstanceGetComputeInstanceProfileInfo": self._ci_profile,
            "nvmlGpuInstanceCreateComputeInstance": self._create_ci,
            "nvmlGpuInstanceGetComputeInstanceById": self._ci_by_id,
            "nvmlComputeInstanceDestroy": self._destroy_ci,
            "nvmlGpuInstanceDestroy": self._destroy_gi,
            "nvmlDeviceGetComputeRunningProcesses": self._processes,
        }
        for name, fn in functions.items():
            monkeypatch.setattr(pynvml, name, self._wrapped(name, fn))

    def fail(self, function: str, error: int) -> None:
        self.errors[function] = error

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.calls}

    def _wrapped(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append((name, args))
            if name in self.errors:
                raise pynvml.NVMLError(self.errors[name])
            return fn(*args)
        return call

    # -- handles -------------------------------------------------------------------------------
    def _gpu(self, h: str) -> FakeGpu:
        return self.gpus[int(h.lstrip("hmgic").split(":")[0])]

    def _instance(self, h: str) -> Instance:
        gpu, gi = self._gpu(h), int(h.split(":")[1])
        if gi not in gpu.instances:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.instances[gi]

    def _uuid(self, h: Any, before: Callable[[Any], Any]) -> bytes:
        if isinstance(h, str) and h.startswith("m"):
            return f"MIG-{self._gpu(h).uuid[4:]}-{h.split(':')[1]}".encode()
        if isinstance(h, str) and h.startswith("h") and h[1:].isdigit() \
                and int(h[1:]) < len(self.gpus):
            return self.gpus[int(h[1:])].uuid.encode()
        return bytes(before(h))

    def _by_uuid(self, uuid: str | bytes, before: Callable[[Any], Any]) -> str:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, g in enumerate(self.gpus):
            if g.uuid == text:
                return f"h{i}"
            for gi in g.instances:
                if text == f"MIG-{g.uuid[4:]}-{gi}":
                    return f"m{i}:{gi}"
        return str(before(uuid))

    def _mode(self, h: str, before: Callable[[Any], Any]) -> list[int]:
        if int(h[1:]) >= len(self.gpus):
            return list(before(h))
        return list(self._gpu(h).mode)

    # -- listing -------------------------------------------------------------------------------
    def _placements(self, h: str, pid: int, places: Any, count: Any) -> int:
        name, _, size = BY_ID[pid]
        starts = A100_80GB.profile(name[4:].removesuffix("+me")).starts  # the guide's table
        for k, s in enumerate(starts):
            places[k].start, places[k].size = s, size
        ctypes.cast(count, ctypes.POINTER(ctypes.c_uint))[0] = len(starts)
        return pynvml.NVML_SUCCESS

    def _profile_info(self, h: str, p: int) -> Any:
        if p not in PROFILES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pid, name, slices, _ = PROFILES[p]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.name, info.sliceCount = pid, name.encode(), slices
        return info

    def _mig_handle(self, h: str, k: int) -> str:
        ids = sorted(self._gpu(h).instances)
        if k >= len(ids):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return f"m{h[1:]}:{ids[k]}"

    def _attributes(self, m: str) -> Any:
        inst = self._instance(m)
        _, slices, size = BY_ID[inst.profile_id]
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.gpuInstanceSliceCount = slices
        attrs.computeInstanceSliceCount = inst.ci_slices or slices
        attrs.memorySizeMB = 9856 * size
        attrs.multiprocessorCount = 14 * slices
        return attrs

    def _gi_by_id(self, h: str, gi: int) -> str:
        self._instance(f"m{h[1:]}:{gi}")
        return f"gi{h[1:]}:{gi}"

    def _gi_info(self, gi: str) -> Any:
        inst = self._instance(gi)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = int(gi.split(":")[1]), inst.profile_id
        info.placement.start, info.placement.size = inst.start, BY_ID[inst.profile_id][2]
        return info

    # -- making and destroying -----------------------------------------------------------------
    def _create_gi(self, h: str, pid: int, placement: Any) -> str:
        place = ctypes.cast(placement, ctypes.POINTER(pynvml.c_nvmlGpuInstancePlacement_t))[0]
        gpu = self._gpu(h)
        size = BY_ID[pid][2]
        if place.size != size:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        taken = {s for i in gpu.instances.values()
                 for s in range(i.start, i.start + BY_ID[i.profile_id][2])}
        if taken & set(range(place.start, place.start + size)):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = max(gpu.instances, default=0) + 1
        gpu.instances[gi] = Instance(pid, place.start, ci=-1)
        return f"gi{h[1:]}:{gi}"

    def _ci_profile(self, gi: str, p: int, engine: int) -> Any:
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = 100 + p
        return info

    def _create_ci(self, gi: str, ci_profile: int) -> str:
        inst = self._instance(gi)
        inst.ci = 0
        return f"ci{gi[2:]}:0"

    def _ci_by_id(self, gi: str, ci: int) -> str:
        if self._instance(gi).ci != ci:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return f"ci{gi[2:]}:{ci}"

    def _destroy_ci(self, ci: str) -> None:
        inst = self._instance(ci)
        if inst.processes:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        inst.ci = -1

    def _destroy_gi(self, gi: str) -> None:
        gpu = self._gpu(gi)
        del gpu.instances[int(gi.split(":")[1])]

    def _processes(self, m: str) -> list[Any]:
        out = []
        for pid in self._instance(m).processes:
            p = pynvml.c_nvmlProcessInfo_t()
            p.pid = pid
            out.append(p)
        return out
