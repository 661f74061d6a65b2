"""What a pod asks for, as values the core can place."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpupool.core.errors import InvalidInput
from gpupool.core.mig import check_profile_name
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.selector import Selector

MAX_GPUS_PER_POD = 64


class Mode(Enum):
    """Exclusive: whole GPUs, nothing else may land there. Shared: a slice."""

    EXCLUSIVE = "exclusive"
    SHARED = "shared"


class Affinity(Enum):
    """Where a pod's containers go among the chosen node's GPUs."""

    LEAST_LOADED = "least-loaded"
    POD = "pod"


class Serving(Enum):
    """Where a pod's GPU slices may be served (``gpupool.core.serving`` places them).

    ``LOCAL``: by its own node's devices (the default). ``REMOTE_ALLOWED``: by its own
    node's devices when they have room, else by a slice server on another node.
    ``REMOTE_REQUIRED``: always by a slice server, on its own node when it has room.
    """

    LOCAL = "local"
    REMOTE_ALLOWED = "remote-allowed"
    REMOTE_REQUIRED = "remote-required"


@dataclass(frozen=True, slots=True)
class GpuDemand:
    """One container's GPU ask: ``count`` GPUs, each with memory and compute.

    In exclusive mode the memory and compute fields are ignored: whole GPUs.
    In shared mode at least one of memory or compute must be asked.

    ``memory_limit_mib`` and ``core_limit_pct`` make a *burstable* slice: the most the
    container may use while the GPU has room (0: its request, no burst). Placement and
    quota count the request only; docs/design/burst.md.

    ``mig_profile`` asks ``count`` MIG devices of that profile (``core.mig``), each whole
    (exclusive mode): such a demand lands on MIG devices of the profile only, and every
    other demand on ordinary GPUs only.
    """

    count: int
    memory_mib: int = 0
    core_pct: int = 0
    mode: Mode = Mode.SHARED
    container: str = ""
    memory_limit_mib: int = 0
    core_limit_pct: int = 0
    mig_profile: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_GPUS_PER_POD:
            raise InvalidInput(
                f"container {self.container or '?'}: GPU count must be 1..{MAX_GPUS_PER_POD}, "
                f"got {self.count}"
            )
        if self.mode is Mode.SHARED:
            if self.memory_mib < 0 or not 0 <= self.core_pct <= CORE_UNITS_PER_GPU:
                raise InvalidInput(
                    f"container {self.container or '?'}: gpu-core must be 0..100 and "
                    f"gpu-memory >= 0 (got {self.core_pct} % and {self.memory_mib} MiB)"
                )
            if self.memory_mib == 0 and self.core_pct == 0:
                raise InvalidInput(
                    f"container {self.container or '?'}: a shared GPU request must ask for "
                    "gpu-memory or gpu-core"
                )
        self._check_limits()
        if self.mig_profile:
            self._check_mig()

    def _check_mig(self) -> None:
        who = f"container {self.container or '?'}"
        try:
            check_profile_name(self.mig_profile)
        except InvalidInput as exc:
            raise InvalidInput(f"{who}: {exc}") from None
        if not self.exclusive:
            raise InvalidInput(f"{who}: a MIG device is handed out whole; it cannot be shared "
                               "as a slice of memory or compute")

    def _check_limits(self) -> None:
        who = f"container {self.container or '?'}"
        if self.exclusive and (self.memory_limit_mib or self.core_limit_pct):
            raise InvalidInput(f"{who}: whole GPUs have no burst limit")
        if self.memory_limit_mib and self.memory_limit_mib < self.memory_mib:
            raise InvalidInput(f"{who}: GPU memory limit {self.memory_limit_mib} MiB is below "
                               f"its request of {self.memory_mib} MiB")
        if not 0 <= self.core_limit_pct <= CORE_UNITS_PER_GPU or (
                self.core_limit_pct and self.core_limit_pct < self.core_pct):
            raise InvalidInput(f"{who}: GPU compute limit {self.core_limit_pct} % must be "
                               f"{max(self.core_pct, 1)}..100 (its request is {self.core_pct} %)")
        if self.memory_limit_mib < 0:
            raise InvalidInput(f"{who}: GPU memory limit must be >= 0")

    @property
    def bursts(self) -> bool:
        """Whether the container may use more than it asks (a limit above a request)."""
        return self.memory_limit_mib > self.memory_mib or self.core_limit_pct > self.core_pct

    @property
    def exclusive(self) -> bool:
        return self.mode is Mode.EXCLUSIVE

    def describe(self) -> str:
        if self.mig_profile:
            return f"{self.count} MIG device{'s' if self.count > 1 else ''} {self.mig_profile}"
        if self.exclusive:
            return f"{self.count} whole GPU{'s' if self.count > 1 else ''}"
        parts = []
        if self.memory_mib:
            parts.append(f"{self.memory_mib} MiB")
        if self.core_pct:
            parts.append(f"{self.core_pct} % core")
        burst = [f"{self.memory_limit_mib} MiB"] if self.memory_limit_mib > self.memory_mib \
            else []
        burst += [f"{self.core_limit_pct} % core"] if self.core_limit_pct > self.core_pct else []
        up_to = f", up to {' + '.join(burst)}" if burst else ""
        return f"{self.count} × ({' + '.join(parts)}{up_to})"


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod to place. ``key`` names its allocation (namespace/name or uid)."""

    key: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: tuple[GpuDemand, ...] = ()
    models: frozenset[str] | None = None
    selector: Selector | None = None
    group: str | None = None
    tenant: str | None = None
    affinity: Affinity = Affinity.LEAST_LOADED
    gpu_class: str | None = None
    serving: Serving = Serving.LOCAL

    def __post_init__(self) -> None:
        if not self.key:
            raise InvalidInput("a pod request needs a key")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise InvalidInput(f"pod {self.key}: CPU and memory requests must be >= 0")
        if sum(d.count for d in self.gpus) > MAX_GPUS_PER_POD * 4:
            raise InvalidInput(f"pod {self.key}: absurd number of GPUs requested")
        if self.models is not None and not self.models:
            raise InvalidInput(f"pod {self.key}: the list of allowed GPU models is empty")
        if len(self.gpus) > 1:
            mig_profile_of(self)

    @property
    def gpu_count(self) -> int:
        """GPUs of the merged demand (what placement treats as the pod's need)."""
        return merged_demand(self).count if self.gpus else 0

    @property
    def shape(self) -> tuple[object, ...]:
        """Everything placement depends on, minus identity (a cache key)."""
        return (
            self.cpu_milli,
            self.memory_mib,
            tuple((d.count, d.memory_mib, d.core_pct, d.mode, d.mig_profile) for d in self.gpus),
            self.models,
            self.selector,
            self.group,
            self.tenant,
            self.affinity,
        )

    def describe(self) -> str:
        gpu = " and ".join(d.describe() for d in self.gpus) or "no GPU"
        return f"{self.cpu_milli}m CPU, {self.memory_mib} MiB, {gpu}"


def merged_demand(request: PodRequest) -> GpuDemand:
    """One demand standing for all the pod's GPU containers.

    A single container is its own demand. With pod affinity all
    containers share the same GPUs: the merged demand asks the largest count
    with the summed per-GPU slice. Otherwise each container gets GPUs of its
    own: the merged demand asks the summed count with the largest slice, and
    the containers take disjoint runs of the chosen GPUs. Both are exact for
    equal containers and conservative otherwise. Any exclusive container makes
    the whole pod exclusive. A pod's containers ask MIG devices of one profile, or
    none of them asks a MIG device.
    """
    if len(request.gpus) == 1:
        return request.gpus[0]
    if not request.gpus:
        raise InvalidInput(f"pod {request.key} asks for no GPU")
    together = request.affinity is Affinity.POD
    count = max(d.count for d in request.gpus) if together else sum(d.count for d in request.gpus)
    profile = mig_profile_of(request)
    if any(d.exclusive for d in request.gpus):
        return GpuDemand(count, mode=Mode.EXCLUSIVE, mig_profile=profile)
    pick = sum if together else max
    memory = pick(d.memory_mib for d in request.gpus)
    core = pick(d.core_pct for d in request.gpus)
    if core > CORE_UNITS_PER_GPU:
        raise InvalidInput(
            f"pod {request.key}: its containers share GPUs (pod affinity) but together ask "
            f"{core} % of one GPU's compute"
        )
    return GpuDemand(count, memory, core, Mode.SHARED)


def mig_profile_of(request: PodRequest) -> str:
    """The one MIG profile the pod's containers ask ("" when none asks a MIG device);
    ``InvalidInput`` when they ask different kinds (two profiles, or MIG and not)."""
    kinds = {d.mig_profile for d in request.gpus}
    if len(kinds) > 1:
        named = ", ".join(sorted(k or "GPUs or slices" for k in kinds))
        raise InvalidInput(f"pod {request.key}: its containers ask different kinds of GPU "
                           f"({named}); a pod asks MIG devices of one profile, or no MIG "
                           "device")
    return next(iter(kinds), "")
