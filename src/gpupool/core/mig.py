"""MIG (NVIDIA Multi-Instance GPU) as values: profiles, placements, layouts.

A GPU in MIG mode is cut into *MIG devices* (a GPU instance with one compute instance
spanning it), each with its own memory, cache and SMs. The GPU has 7 compute slices and
8 memory slices; a profile (``1g.10gb``, ``3g.40gb``, ...) takes some compute slices and
a run of memory slices that may only start at the places NVIDIA's placement rules allow
(``MigProfile.starts``). Two MIG devices of one GPU never share a memory slice, and
their compute slices never add up past 7.

In the core's model (``model.Gpu.mig``):

* a GPU in MIG mode is a ``Gpu`` whose ``mig`` is a ``MigMode``: it is never handed out
  itself, whole or sliced (``state.ClusterState`` counts it absent);
* each of its MIG devices is a ``Gpu`` of its own (its own uuid ``MIG-...`` and memory)
  whose ``mig`` is a ``MigDevice`` naming the GPU it is carved from, its profile and its
  placement. A MIG device is handed out whole, to pods that ask for its profile
  (``request.GpuDemand.mig_profile``), and never sliced further.

The catalogue (``GEOMETRIES``) holds the GPUs whose profiles NVIDIA's MIG user guide
documents ("Supported MIG Profiles"): A100-SXM4-40GB (and A100-PCIE-40GB), A100 80GB,
H100 80GB and H200 141GB, without the media-extension (``+me``) profiles. Memory is the
profile's nominal size (the GB in its name, as MiB); a real node publishes the memory
NVML reports for each MIG device, which is a little less.

Pure: no I/O (the layout rules are remembered per layout shape: a plan asks them of the
same few layouts many times).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gpupool.core.errors import InvalidInput, UnknownName

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
GIB = 1024

LABEL_PROFILE = "gpupool.io/mig-profile"
"""Selector label of a MIG device: its profile (``1g.10gb``)."""
LABEL_PARENT = "gpupool.io/mig-parent"
"""Selector label of a MIG device: the uuid of the GPU it is carved from."""
LABEL_MODE = "gpupool.io/mig"
"""Selector label of a GPU in MIG mode (``enabled``)."""

_NAME = re.compile(r"^([1-7])g\.([1-9][0-9]*)gb$")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of one GPU geometry (NVIDIA's "Supported MIG Profiles" table)."""

    name: str  # "3g.40gb"
    slices: int  # compute slices (the "3g")
    size: int  # memory slices it spans (its placement size)
    starts: tuple[int, ...]  # memory slices where an instance may start
    memory_mib: int  # nominal memory

    @property
    def count(self) -> int:
        """How many instances of it fit one GPU ("Number of Instances Available")."""
        return len(self.starts)

    def share_milli(self) -> int:
        """Its compute as a share of the GPU in milli-GPU (``1g``: 142)."""
        return self.slices * 1000 // COMPUTE_SLICES


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The MIG profiles of one kind of GPU."""

    name: str  # "A100-80GB"
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.profiles)
        raise UnknownName(f"{self.name} GPUs have no MIG profile {name} (known: {known})")

    def has(self, name: str) -> bool:
        return any(p.name == name for p in self.profiles)


def _geometry(name: str, gb: tuple[int, int, int, int, int, int]) -> MigGeometry:
    """NVIDIA's seven-slice geometry: 1g on one memory slice, 1g on two, 2g, 3g, 4g, 7g."""
    small, wide, two, three, four, seven = gb
    rows = ((1, 1, tuple(range(7)), small), (1, 2, (0, 2, 4, 6), wide), (2, 2, (0, 2, 4), two),
            (3, 4, (0, 4), three), (4, 4, (0,), four), (7, 8, (0,), seven))
    return MigGeometry(name, tuple(MigProfile(f"{g}g.{mem}gb", g, size, starts, mem * GIB)
                                   for g, size, starts, mem in rows))


GEOMETRIES: tuple[MigGeometry, ...] = (
    _geometry("A100-40GB", (5, 10, 10, 20, 20, 40)),
    _geometry("A100-80GB", (10, 20, 20, 40, 40, 80)),
    _geometry("H100-80GB", (10, 20, 20, 40, 40, 80)),
    _geometry("H200-141GB", (18, 35, 35, 71, 71, 141)),
)
"""The GPUs whose MIG profiles gpupool knows (MIG user guide, "Supported MIG Profiles")."""


@lru_cache(maxsize=256)
def geometry_of(model: str, memory_mib: int) -> MigGeometry | None:
    """The MIG geometry of a GPU from its model name and memory (None: not one gpupool
    knows — a GPU without MIG, or one whose profiles are not in the catalogue)."""
    text = model.upper()
    for family, small, large in (("A100", "A100-40GB", "A100-80GB"),
                                 ("H100", "H100-80GB", ""), ("H200", "H200-141GB", "")):
        if family not in text:
            continue
        if family == "A100":
            return by_name(small if memory_mib <= 48 * GIB else large)
        if family == "H100" and memory_mib > 82 * GIB:  # the 94 and 96 GB H100s differ
            return None
        return by_name(small)
    return None


@lru_cache(maxsize=16)
def by_name(name: str) -> MigGeometry:
    for g in GEOMETRIES:
        if g.name == name:
            return g
    raise UnknownName(f"no MIG geometry {name} (known: "
                      f"{', '.join(g.name for g in GEOMETRIES)})")


def check_profile_name(name: str) -> str:
    """``name`` if it reads as a MIG profile (``<g>g.<gb>gb``), else ``InvalidInput``."""
    if not _NAME.match(name):
        raise InvalidInput(f"{name!r} is not a MIG profile name (like 1g.10gb or 3g.40gb)")
    return name


def slices_of(name: str) -> int:
    """The compute slices a profile name says (``3g.40gb`` -> 3)."""
    return int(check_profile_name(name).partition("g")[0])


# -- what is on a GPU -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MigMode:
    """A GPU in MIG mode. ``instances``: the MIG devices NVML (or a fake file) lists, on the
    node; empty in the core, which reads a node's MIG devices from its ``Gpu`` list."""

    instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class MigDevice:
    """Where a MIG device is: its GPU, profile and placement (memory slices
    ``start .. start + size - 1``), and NVML's ids for it (-1: not known)."""

    parent: str
    profile: str
    start: int
    size: int
    slices: int
    gpu_instance: int = -1
    compute_instance: int = -1

    def __post_init__(self) -> None:
        if not self.parent:
            raise InvalidInput(f"MIG device {self.profile}: needs the uuid of its GPU")
        check_profile_name(self.profile)
        if not (0 <= self.start < MEMORY_SLICES and 1 <= self.size <= MEMORY_SLICES
                and self.start + self.size <= MEMORY_SLICES):
            raise InvalidInput(f"MIG device {self.profile} on {self.parent}: placement "
                               f"{self.start}:{self.size} is outside the GPU's "
                               f"{MEMORY_SLICES} memory slices")
        if not 1 <= self.slices <= COMPUTE_SLICES:
            raise InvalidInput(f"MIG device {self.profile} on {self.parent}: {self.slices} "
                               f"compute slices (1..{COMPUTE_SLICES})")

    def memory_slices(self) -> range:
        return range(self.start, self.start + self.size)

    def describe(self) -> str:
        return f"{self.profile}@{self.start}"


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG device as the node sees it: identity, memory, SMs and where it is."""

    uuid: str
    memory_mib: int
    device: MigDevice
    sm_count: int = 0


def device_at(geometry: MigGeometry, parent: str, profile: str, start: int) -> MigDevice:
    """A MIG device of ``profile`` at memory slice ``start`` (not checked against others)."""
    p = geometry.profile(profile)
    if start not in p.starts:
        raise InvalidInput(f"{profile} cannot start at memory slice {start} on a "
                           f"{geometry.name} GPU (it may start at "
                           f"{', '.join(map(str, p.starts))})")
    return MigDevice(parent, p.name, start, p.size, p.slices)


def layout_problem(geometry: MigGeometry, devices: Sequence[MigDevice]) -> str:
    """Why ``devices`` cannot be on one GPU of ``geometry`` together ("" when they can):
    an unknown profile, a placement NVIDIA does not allow, two devices on one memory
    slice, or more than 7 compute slices."""
    used: dict[int, str] = {}
    for d in devices:
        if not geometry.has(d.profile):
            return f"{d.profile} is not a {geometry.name} MIG profile"
        p = geometry.profile(d.profile)
        if d.start not in p.starts or d.size != p.size:
            return (f"{d.profile} cannot be placed at {d.start}:{d.size} (it starts at "
                    f"{', '.join(map(str, p.starts))} and spans {p.size} memory slices)")
        for s in d.memory_slices():
            if s in used:
                return f"{d.describe()} and {used[s]} share memory slice {s}"
            used[s] = d.describe()
    compute = sum(d.slices for d in devices)
    if compute > COMPUTE_SLICES:
        return f"the devices take {compute} compute slices, the GPU has {COMPUTE_SLICES}"
    return ""


def check_layout(geometry: MigGeometry, devices: Sequence[MigDevice], where: str) -> None:
    problem = layout_problem(geometry, devices)
    if problem:
        raise InvalidInput(f"{where}: {problem}")


Shape = tuple[tuple[int, int, int], ...]
"""A layout as (start, size, compute slices) per device, by start: all its rules read."""


def shape_of(devices: Iterable[MigDevice]) -> Shape:
    return tuple(sorted((d.start, d.size, d.slices) for d in devices))


def free_starts(geometry: MigGeometry, devices: Sequence[MigDevice], profile: str
                ) -> list[int]:
    """Where one more ``profile`` device could be created beside ``devices``."""
    return list(_free_starts(geometry.name, shape_of(devices), profile))


@lru_cache(maxsize=1 << 14)
def _free_starts(geometry: str, shape: Shape, profile: str) -> tuple[int, ...]:
    p = by_name(geometry).profile(profile)
    taken = {s for start, size, _ in shape for s in range(start, start + size)}
    if sum(slices for _, _, slices in shape) + p.slices > COMPUTE_SLICES:
        return ()
    return tuple(s for s in p.starts if not taken & set(range(s, s + p.size)))


def stranded(geometry: MigGeometry, devices: Sequence[MigDevice],
             weights: Mapping[str, float]) -> float:
    """The compute slices a layout is expected to strand for the next MIG device asked:
    ``Σ_p w_p · [no p fits] · free compute slices``, ``w`` the share of each profile in
    the demand (FGD's fragmentation measure, in MIG slices). An empty ``weights`` weighs
    the geometry's profiles alike."""
    return _stranded(geometry.name, shape_of(devices), tuple(sorted(weights.items())))


@lru_cache(maxsize=1 << 14)
def _stranded(geometry: str, shape: Shape, weights: tuple[tuple[str, float], ...]) -> float:
    free = COMPUTE_SLICES - sum(slices for _, _, slices in shape)
    if free <= 0:
        return 0.0
    mix = _normalised(geometry, weights)
    return sum(w * free for name, w in mix if not _free_starts(geometry, shape, name))


def normalised(geometry: MigGeometry, weights: Mapping[str, float]) -> dict[str, float]:
    """``weights`` restricted to the geometry's profiles, summing to 1 (alike when none)."""
    return dict(_normalised(geometry.name, tuple(sorted(weights.items()))))


@lru_cache(maxsize=256)
def _normalised(name: str, weights: tuple[tuple[str, float], ...]
                ) -> tuple[tuple[str, float], ...]:
    geometry = by_name(name)
    given = dict(weights)
    mix = {p.name: float(given.get(p.name, 0.0)) for p in geometry.profiles}
    total = sum(w for w in mix.values() if w > 0)
    if total <= 0:
        return tuple((p.name, 1.0 / len(geometry.profiles)) for p in geometry.profiles)
    return tuple((k, max(w, 0.0) / total) for k, w in mix.items())


def describe_layout(devices: Iterable[MigDevice]) -> str:
    """A layout as ``1g.10gb@0,3g.40gb@4`` (by placement; ``-`` when empty)."""
    return ",".join(d.describe() for d in sorted(devices, key=lambda d: d.start)) or "-"


def read_layout(geometry: MigGeometry, parent: str, text: str, where: str
                ) -> tuple[MigDevice, ...]:
    """``describe_layout``'s form back into devices (checked; ``-`` or "" is empty)."""
    text = text.strip()
    if text in ("", "-"):
        return ()
    devices = []
    for part in text.split(","):
        profile, at, start = part.strip().partition("@")
        if not at or not start.isdigit():
            raise InvalidInput(f"{where}: {part.strip()!r} must be <profile>@<start>")
        try:
            devices.append(device_at(geometry, parent, profile, int(start)))
        except (InvalidInput, UnknownName) as exc:
            raise InvalidInput(f"{where}: {exc}") from None
    check_layout(geometry, devices, where)
    return tuple(devices)
