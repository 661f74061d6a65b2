"""Container environment a pod may not set: what decides which GPUs it sees and its limits.

Kubelet gives a container the device plugin's environment first and then the pod's
own, so a variable the pod sets wins: ``NVIDIA_VISIBLE_DEVICES=all`` would widen the
GPUs the NVIDIA container runtime exposes (where it reads that variable), and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` or HAMi-core's ``CUDA_DEVICE_MEMORY_LIMIT`` would
raise the slice's limits. A GPU pod (one that asks a gpupool resource) may set none
of the ``GUARDS`` in any container, init container or ephemeral container, neither in
``env`` nor through ``envFrom`` (ConfigMap and Secret keys are not known at admission,
so ``envFrom`` must carry a ``prefix`` that cannot produce a guarded name). A pod that
asks no gpupool resource may not name GPUs in ``NVIDIA_VISIBLE_DEVICES`` either
(``void``/``none`` hide them and stay allowed), nor set it through ``valueFrom`` (its
value is not known at admission); its ``envFrom`` stays free (docs/webhook.md says why).
Decisions and their reasons are in docs/security.md. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Guard:
    """A variable name (or, with ``prefix``, every name starting so) and why it is guarded."""

    name: str
    why: str
    prefix: bool = False

    def matches(self, variable: str) -> bool:
        return variable.startswith(self.name) if self.prefix else variable == self.name

    def reachable_from(self, env_prefix: str) -> bool:
        """Whether ``envFrom`` with ``env_prefix`` (and any key) could produce a guarded name."""
        if self.prefix:
            return self.name.startswith(env_prefix) or env_prefix.startswith(self.name)
        return self.name.startswith(env_prefix) and len(self.name) > len(env_prefix)

    @property
    def shown(self) -> str:
        return f"{self.name}*" if self.prefix else self.name


VISIBILITY = Guard("NVIDIA_VISIBLE_DEVICES", "it chooses the GPUs the NVIDIA container runtime "
                   "exposes")
GUARDS: tuple[Guard, ...] = (
    VISIBILITY,
    Guard("NVIDIA_MIG_CONFIG_DEVICES", "it exposes MIG configuration devices"),
    Guard("NVIDIA_MIG_MONITOR_DEVICES", "it exposes MIG monitoring devices"),
    Guard("CUDA_MPS_", "MPS variables set the slice's limits and the MPS daemon a process "
          "joins", prefix=True),
    Guard("CUDA_DEVICE_MEMORY_LIMIT", "it is HAMi-core's memory limit", prefix=True),
    Guard("CUDA_DEVICE_SM_LIMIT", "it is HAMi-core's compute limit", prefix=True),
    Guard("CUDA_DEVICE_MEMORY_SHARED_CACHE", "it is HAMi-core's usage record"),
    Guard("CUDA_OVERSUBSCRIBE", "it lets HAMi-core hand out more memory than the slice"),
    Guard("GPU_CORE_UTILIZATION_POLICY", "it can switch HAMi-core's compute limit off"),
    Guard("CUDA_TASK_PRIORITY", "it sets HAMi-core's scheduling priority"),
    Guard("LD_PRELOAD", "a preloaded library can bypass the isolation interposer"),
    Guard("LD_AUDIT", "an audit library can bypass the isolation interposer"),
    Guard("GPUPOOL_", "gpupool describes the slice in these", prefix=True),
)
HIDING_VALUES = frozenset({"void", "none", ""})
"""``NVIDIA_VISIBLE_DEVICES`` values that expose no GPU (allowed on every pod)."""
CONTAINER_LISTS = (("containers", "container"), ("initContainers", "init container"),
                   ("ephemeralContainers", "ephemeral container"))


_EXACT = {g.name: g for g in GUARDS if not g.prefix}
_PREFIXES = tuple(g.name for g in GUARDS if g.prefix)


def guard_of(variable: str) -> Guard | None:
    """The guard ``variable`` falls under (one dict look-up and one ``startswith`` for the
    common, unguarded case: pods carry hundreds of variables)."""
    exact = _EXACT.get(variable)
    if exact is not None or not variable.startswith(_PREFIXES):
        return exact
    return next(g for g in GUARDS if g.prefix and g.matches(variable))


def _containers(spec: Mapping[str, Any], lists: tuple[tuple[str, str], ...]
                ) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for key, noun in lists:
        items = spec.get(key)
        for c in items if isinstance(items, list) else ():
            if isinstance(c, Mapping):
                yield f"{noun} {c.get('name', '?')}", c


def _env_problems(where: str, container: Mapping[str, Any], gpu_pod: bool) -> Iterator[str]:
    env = container.get("env")
    for item in env if isinstance(env, list) else ():
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str):
            continue
        guard = guard_of(name)
        if guard is None:
            continue
        if gpu_pod:
            yield f"{where} sets {name}: {guard.why}"
        elif guard is VISIBILITY:
            yield from _visibility_problems(where, name, item)


def _visibility_problems(where: str, name: str, item: Mapping[str, Any]) -> Iterator[str]:
    """``NVIDIA_VISIBLE_DEVICES`` on a pod that asks no GPU: only a value that hides GPUs."""
    source = item.get("valueFrom")
    if source is not None:  # a ConfigMap, Secret, field or resource: unknown at admission
        kinds = ", ".join(str(k) for k in source) if isinstance(source, Mapping) else "?"
        yield (f"{where} sets {name} through valueFrom.{kinds} without asking a GPU: its value "
               "is not known at admission and could expose GPUs gpupool did not grant (set "
               "value void or none, or leave it out)")
    elif str(item.get("value") or "").strip().lower() not in HIDING_VALUES:
        yield (f"{where} sets {name}={str(item.get('value') or '')[:40]!r} without asking "
               "a GPU: it would expose GPUs gpupool did not grant (void or none hide them)")


def _env_from_problems(where: str, container: Mapping[str, Any]) -> Iterator[str]:
    sources = container.get("envFrom")
    for item in sources if isinstance(sources, list) else ():
        if not isinstance(item, Mapping):
            continue
        prefix = str(item.get("prefix") or "")
        ref = item.get("configMapRef") or item.get("secretRef") or {}
        kind = "ConfigMap" if "configMapRef" in item else "Secret"
        source = f"{kind} {ref.get('name', '?') if isinstance(ref, Mapping) else '?'}"
        reachable = [g.shown for g in GUARDS if g.reachable_from(prefix)]
        if reachable:
            shown = f"prefix {prefix!r}" if prefix else "no prefix"
            yield (f"{where} takes envFrom {source} with {shown}, which could set "
                   f"{', '.join(reachable[:4])}{' ...' if len(reachable) > 4 else ''}: give it "
                   "a prefix such as APP_, or list the variables in env")


def problems(spec: Mapping[str, Any], gpu_pod: bool,
             lists: tuple[tuple[str, str], ...] = CONTAINER_LISTS) -> list[str]:
    """Why the containers of ``spec`` may not run as written (empty: they may)."""
    out: list[str] = []
    for where, container in _containers(spec, lists):
        out += _env_problems(where, container, gpu_pod)
        if gpu_pod:
            out += _env_from_problems(where, container)
    return out
