"""``hami-core``: the open-source HAMi-core interposer (``libvgpu.so``), when installed.

gpupool integrates HAMi-core as HAMi's device plugin does; it does not re-implement it.
For a shared slice the container gets:

* the library, read-only, at ``/usr/local/vgpu/libvgpu.so``, and ``/etc/ld.so.preload``
  naming it (read-only), so the dynamic loader preloads it into every process of the
  container — without ``LD_PRELOAD``, which a container could clear;
* HAMi-core's documented limits: ``CUDA_DEVICE_MEMORY_LIMIT_<n>=<MiB>m`` per visible GPU
  ``n`` and ``CUDA_DEVICE_SM_LIMIT=<percent>`` (the smallest compute share of its slices);
* a per-container directory for HAMi-core's shared usage region
  (``CUDA_DEVICE_MEMORY_SHARED_CACHE``) and the node's lock directory at
  ``/tmp/vgpulock``, as HAMi-core expects.

Host layout under ``--state-dir``: ``hami-core/ld.so.preload`` (written by the agent),
``hami-core/vgpulock/``, ``hami-core/containers/<pod uid>_<container>/`` (removed when
the pod is gone). The library itself is the node's (``--hami-core-library``); the
agent refuses to start with this provider when it is missing.

What it enforces: allocations through CUDA beyond the memory limit fail, and kernel
launches are throttled to the SM share — for processes that keep the limits they were
given. A process that rewrites its own environment before CUDA starts can lift them;
the usage monitor is what catches that.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from gpupool.contract.isolation import ProviderName, hami_core_limits
from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.envs import ContainerEdits, Mount
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.isolation.provider import (
    Holdings,
    ProviderRefusal,
    SliceGrant,
)

log = logging.getLogger(__name__)

DEFAULT_LIBRARY = "/usr/local/vgpu/libvgpu.so"
LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
CACHE_IN_CONTAINER = "/usr/local/vgpu/cache"
LOCK_IN_CONTAINER = "/tmp/vgpulock"
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"


class HamiCoreProvider:
    """The ``hami-core`` isolation provider of one node."""

    name = ProviderName.HAMI_CORE

    def __init__(self, library: Path, state_dir: Path):
        self.library = Path(library)
        self.root = Path(state_dir) / "hami-core"

    @property
    def enforced(self) -> bool:
        return True

    @property
    def preload(self) -> Path:
        return self.root / "ld.so.preload"

    @property
    def lock_dir(self) -> Path:
        return self.root / "vgpulock"

    def start(self, gpus: Sequence[GpuInfo], changed: Callable[[], None]) -> None:
        if not self.library.is_file():
            raise InvalidInput(
                f"the hami-core isolation provider needs HAMi-core's library at {self.library}"
                " (install HAMi-core on the node, give --hami-core-library, or choose another"
                " --isolation-provider)")
        try:
            (self.root / "containers").mkdir(parents=True, exist_ok=True)
            self.lock_dir.mkdir(parents=True, exist_ok=True)
            self.lock_dir.chmod(0o1777)
            self.preload.write_text(LIBRARY_IN_CONTAINER + "\n")
            self.preload.chmod(0o644)
        except OSError as exc:
            raise InvalidInput(f"the hami-core isolation provider cannot prepare {self.root}: "
                               f"{exc.strerror or exc} (check --state-dir)") from None
        log.info("hami-core isolation: %s preloaded into shared containers", self.library)

    def stop(self) -> None:
        return None

    def edits(self, grant: SliceGrant) -> ContainerEdits:
        if grant.exclusive:
            return ContainerEdits()
        cache = self.root / "containers" / _dir_name(grant.pod_uid, grant.container)
        try:
            cache.mkdir(parents=True, exist_ok=True)
            cache.chmod(0o777)  # the container's processes run as any user
        except OSError as exc:
            raise ProviderRefusal(f"cannot prepare HAMi-core's usage directory {cache}: "
                                  f"{exc.strerror or exc}", "isolation-unavailable") from None
        envs = hami_core_limits(grant.slices)
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{CACHE_IN_CONTAINER}/vgpu.cache"
        mounts = (Mount(LIBRARY_IN_CONTAINER, str(self.library), read_only=True),
                  Mount(PRELOAD_IN_CONTAINER, str(self.preload), read_only=True),
                  Mount(CACHE_IN_CONTAINER, str(cache)),
                  Mount(LOCK_IN_CONTAINER, str(self.lock_dir)))
        return ContainerEdits(envs, mounts)

    def sync(self, holdings: Holdings, live_pods: set[str]) -> None:
        """Remove the usage directories of pods that are gone."""
        containers = self.root / "containers"
        for entry in containers.iterdir() if containers.is_dir() else ():
            uid = entry.name.partition("_")[0]
            if uid not in live_pods:
                shutil.rmtree(entry, ignore_errors=True)

    def problems(self) -> dict[str, str]:
        if self.library.is_file():
            return {}
        return {"*": f"hami-core: the library {self.library} is gone"}


def _dir_name(uid: str, container: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "-", uid) + "_" + re.sub(r"[^A-Za-z0-9.-]", "-", container)
