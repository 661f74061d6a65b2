"""The GPUs both node agents serve: a vanished GPU is kept, unhealthy; the isolation
provider's problems make a GPU unhealthy with its reason."""

from __future__ import annotations

from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.roster import VANISHED, GpuRoster


def gpu(i: int, healthy: bool = True, reason: str = "") -> GpuInfo:
    return GpuInfo(f"GPU-{i}", i, "A100", 40960, healthy=healthy, reason=reason)


def test_a_vanished_gpu_is_kept_unhealthy_and_healthy_again_when_it_is_back() -> None:
    roster = GpuRoster([gpu(0), gpu(1)])
    roster.update([gpu(1)])
    assert list(roster.present) == ["GPU-1"]
    assert [(g.uuid, g.healthy, g.reason) for g in roster.served({})] == [
        ("GPU-0", False, VANISHED), ("GPU-1", True, "")]
    roster.update([gpu(0), gpu(1)])
    assert all(g.healthy for g in roster.served({}))


def test_the_providers_problems_make_gpus_unhealthy_with_its_reason_by_index() -> None:
    roster = GpuRoster([gpu(2), gpu(0), gpu(1, healthy=False, reason="XID 79")])
    served = roster.served({"GPU-2": "MPS daemon down"})
    assert [(g.index, g.healthy, g.reason) for g in served] == [
        (0, True, ""), (1, False, "XID 79"), (2, False, "MPS daemon down")]
    everywhere = roster.served({"*": "no MPS control binary"})
    assert [g.reason for g in everywhere] == ["no MPS control binary", "XID 79",
                                              "no MPS control binary"]
