"""How a container is given its GPUs, so that its own environment cannot widen them.

Kubelet merges a device plugin's variables *under* the container's own ``env``: a
pod that sets ``NVIDIA_VISIBLE_DEVICES=all`` would override an answer that named its
GPUs in that variable, and the NVIDIA container runtime would give it every GPU.
So the answer names the GPUs where a pod author cannot write
(``--device-list-strategy``):

* ``volume-mounts`` (default): one mount of ``/dev/null`` at
  ``/var/run/nvidia-container-devices/<GPU uuid>`` per GPU, and
  ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices``. The NVIDIA container
  toolkit reads the GPUs from those mounts when configured with
  ``accept-nvidia-visible-devices-as-volume-mounts = true`` and
  ``accept-nvidia-visible-devices-envvar-when-unprivileged = false``; it only counts
  mounts whose source is ``/dev/null`` (pods must not be allowed hostPath volumes:
  Pod Security "baseline" or stricter).
* ``cdi``: the CDI device names ``<kind>=<GPU uuid>`` (default kind ``nvidia.com/gpu``,
  from ``nvidia-ctk cdi generate --device-name-strategy=uuid``) in the
  ``cdi_devices`` field of the answer; the CDI-enabled runtime (containerd ≥ 1.7,
  CRI-O ≥ 1.24) injects exactly those devices. ``NVIDIA_VISIBLE_DEVICES=void``.
* ``envvar``: the old ``NVIDIA_VISIBLE_DEVICES=<uuids>``, which a pod can override;
  kept for clusters that cannot use either of the above, and logged as unsafe.

Independently of the strategy, a GPU container whose own ``env`` sets a variable that
controls device visibility or limits, or whose ``envFrom`` could (no prefix, or a
prefix that protected names start with), is refused (``env_override``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.envs import ContainerEdits, Mount
from gpupool.nodeagent.pods import GpuContainer

DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"
DEFAULT_CDI_KIND = "nvidia.com/gpu"

PROTECTED_PREFIXES = ("NVIDIA_", "CUDA_MPS_", "CUDA_DEVICE_", "GPUPOOL_")
"""Variables a GPU container may not set itself: the NVIDIA runtime's, CUDA MPS's, the
HAMi-core interposer's (``CUDA_DEVICE_MEMORY_LIMIT_<n>``, ``CUDA_DEVICE_SM_LIMIT``, ...)
and gpupool's own."""
PROTECTED_NAMES = ("LD_PRELOAD", "LD_AUDIT", "CUDA_OVERSUBSCRIBE", "CUDA_DISABLE_CONTROL",
                   "GPU_CORE_UTILIZATION_POLICY", "CUDA_TASK_PRIORITY", "ACTIVE_OOM_KILLER")


class Strategy(StrEnum):
    VOLUME_MOUNTS = "volume-mounts"
    CDI = "cdi"
    ENVVAR = "envvar"


@dataclass(frozen=True, slots=True)
class Exposure:
    """The device-list strategy of this node."""

    strategy: Strategy = Strategy.VOLUME_MOUNTS
    cdi_kind: str = DEFAULT_CDI_KIND

    def __post_init__(self) -> None:
        vendor, _, cls = self.cdi_kind.partition("/")
        if not vendor or not cls or "=" in self.cdi_kind:
            raise InvalidInput(f"CDI kind must be '<vendor>/<class>' (e.g. {DEFAULT_CDI_KIND}), "
                               f"got {self.cdi_kind!r}")

    @property
    def safe(self) -> bool:
        """Whether a pod's own environment cannot widen the GPUs it gets."""
        return self.strategy is not Strategy.ENVVAR

    def edits(self, uuids: Sequence[str]) -> ContainerEdits:
        if self.strategy is Strategy.CDI:
            return ContainerEdits({"NVIDIA_VISIBLE_DEVICES": "void"},
                                  cdi_devices=tuple(f"{self.cdi_kind}={u}" for u in uuids))
        if self.strategy is Strategy.VOLUME_MOUNTS:
            mounts = tuple(Mount(f"{DEVICE_LIST_ROOT}/{u}", "/dev/null", True) for u in uuids)
            return ContainerEdits({"NVIDIA_VISIBLE_DEVICES": DEVICE_LIST_ROOT}, mounts)
        return ContainerEdits({"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)})


def is_protected(name: str) -> bool:
    return name in PROTECTED_NAMES or name.startswith(PROTECTED_PREFIXES)


def unsafe_prefix(prefix: str) -> bool:
    """Could ``envFrom`` with this prefix set a protected variable (whatever its keys)?"""
    if not prefix:
        return True
    return any(prefix.startswith(q) or q.startswith(prefix) for q in PROTECTED_PREFIXES) or \
        any(n.startswith(prefix) for n in PROTECTED_NAMES)


def env_override(container: GpuContainer) -> str | None:
    """Why ``container`` may not be served (it could override its GPUs or limits), or None."""
    named = sorted({n for n in container.env if is_protected(n)})
    if named:
        return (f"container {container.name} sets {', '.join(named)} itself; these control "
                "which GPUs and how much of them it gets, and only gpupool may set them")
    risky = sorted({p for p in container.env_from if unsafe_prefix(p)})
    if risky:
        shown = ", ".join(repr(p) for p in risky)
        return (f"container {container.name} takes variables from envFrom with prefix {shown}, "
                "which could set variables that control its GPUs; give envFrom a prefix such "
                "as 'APP_'")
    return None
