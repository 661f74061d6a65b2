"""The GPUs a node agent (device-plugin or DRA mode) serves: those present now, and every one
seen since it started.

A GPU that vanishes (fell off the bus, driver reset) stays in the roster, unhealthy with
reason ``vanished``, so that kubelet and the GPUDevice inventory see it go rather than
lose track of it. The isolation provider's problems (a GPU its daemon cannot serve, or
``*`` for all) make a GPU unhealthy too, with the provider's reason.

A GPU in MIG mode comes with its MIG devices, each a GPU of the roster of its own
(``nodeagent.mig.units``).

Updated by the GPU backend's health watcher thread and read by any thread: each update
replaces whole dictionaries, so a reader sees one roster or the next, never half of one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpupool.nodeagent import mig
from gpupool.nodeagent.gpu import GpuInfo

VANISHED = "vanished"


class GpuRoster:
    """GPUs present now and known since start, by uuid."""

    def __init__(self, present: Sequence[GpuInfo]):
        self.present: dict[str, GpuInfo] = {g.uuid: g for g in mig.units(present)}
        self.known: dict[str, GpuInfo] = dict(self.present)

    def update(self, present: Sequence[GpuInfo]) -> None:
        """The backend's latest list: missing GPUs are kept as vanished (MIG devices
        destroyed on a GPU still present are dropped: ``mig.gone``)."""
        listed = {g.uuid: g for g in mig.units(present)}
        now = dict(listed)
        for uuid, gpu in self.known.items():
            if uuid not in now and not mig.gone(gpu, listed):
                now[uuid] = replace(gpu, healthy=False, reason=VANISHED)
        self.present = listed
        self.known = now

    def served(self, problems: Mapping[str, str]) -> list[GpuInfo]:
        """Every known GPU by index, then uuid (a GPU in MIG mode before its MIG devices,
        which share its index); one the isolation provider has a problem with
        (``problems``: uuid, or ``*`` for every GPU, -> why) is unhealthy for that reason."""
        everywhere = problems.get("*", "")
        out = []
        for gpu in self.known.values():
            problem = problems.get(gpu.uuid, everywhere)
            out.append(replace(gpu, healthy=False, reason=problem)
                       if problem and gpu.healthy else gpu)
        return sorted(out, key=lambda g: (g.index, g.uuid))  # the extender's order
