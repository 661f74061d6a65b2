"""What a remote slice uses, reported in the shape the node agent's over-use monitor reads.

The slice server samples its provider and reports one record per session — one slice
of one GPU for one container of one pod — whose keys are exactly the fields of the
node agent's ``Observation`` (``gpupool.nodeagent.overuse``), so that the same tracker,
actions (``warn``, ``isolate``, ``evict``) and per-container metrics apply::

    {"pod_uid", "pod_ref", "container", "gpu_uuid", "memory_mib", "sm_pct",
     "memory_limit_mib", "core_limit_pct", "exclusive"}

``memory_mib`` is the memory the provider holds, rounded up to whole MiB (a byte over
the slice shows); ``sm_pct`` the share of the last sampling period the provider's
kernels kept the device busy (None before the second sample). The stub provider
reports both (its ``usage`` operation); other providers report nothing here — their
process is seen by NVML on the node like any container's (docs/remote.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gpupool.remote import frames
from gpupool.remote.provider import LOOPBACK, SliceSpec

MIB = 1 << 20
USAGE_LIMITS = frames.Limits(max_payload=0, frame_s=5.0, idle_s=5.0)


@dataclass(frozen=True, slots=True)
class UsageSample:
    memory_bytes: int
    busy_ns: int
    at_ns: int  # monotonic time of the sample


class UsageMeter:
    """Turns successive samples into records (compute: busy time over the period)."""

    def __init__(self, spec: SliceSpec):
        self.spec = spec
        self.last: UsageSample | None = None
        self.record: dict[str, Any] = self._record(0, None)

    def add(self, sample: UsageSample) -> dict[str, Any]:
        before, self.last = self.last, sample
        sm = None
        if before is not None and sample.at_ns > before.at_ns:
            busy = max(0, sample.busy_ns - before.busy_ns)
            sm = min(100, round(100 * busy / (sample.at_ns - before.at_ns)))
        self.record = self._record(-(-sample.memory_bytes // MIB), sm)
        return self.record

    def released(self) -> dict[str, Any]:
        """The record once the slice is released: nothing held, nothing running."""
        self.record = self._record(0, 0)
        return self.record

    def _record(self, memory_mib: int, sm_pct: int | None) -> dict[str, Any]:
        s = self.spec
        return {"pod_uid": s.pod_uid, "pod_ref": s.pod_ref, "container": s.container,
                "gpu_uuid": s.gpu_uuid, "memory_mib": memory_mib, "sm_pct": sm_pct,
                "memory_limit_mib": s.memory_mib, "core_limit_pct": s.core_pct,
                "exclusive": s.exclusive}


async def stub_sample(port: int, now_ns: int) -> UsageSample:
    """Ask the stub provider on loopback ``port`` for its usage (``OSError``,
    ``FrameError`` when it does not answer)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), 5.0)
    try:
        await frames.send(writer, {"op": "usage"})
        frame = await frames.read(reader, USAGE_LIMITS)
    finally:
        await frames.close(writer)
    if frame is None or not frame.header.get("ok"):
        raise frames.FrameError("bad-answer", f"the stub's usage answer: "
                                f"{frame.header if frame else 'none'}")
    return UsageSample(frames.whole(frame.header, "memory_bytes"),
                       frames.whole(frame.header, "busy_ns"), now_ns)
