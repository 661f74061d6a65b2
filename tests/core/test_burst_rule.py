"""The burst rule the node agent and the simulator share: shortfall and reclaim order."""

from __future__ import annotations

import pytest

from gpupool.core.burst import Bursting, reclaim, short


@pytest.mark.parametrize("uses, other, lacking", [
    ([(12000, 4096), (0, 8192)], 0, 3808),  # a slice not started yet counts its request
    ([(3000, 4096), (5000, 4096)], 0, 0),  # under its request a slice counts the request
    ([(12000, 4096)], 5000, 616),  # use no slice accounts for counts too
])
def test_a_gpu_is_short_by_what_its_slices_requests_need_beyond_its_capacity(
        uses: list[tuple[int, int]], other: int, lacking: int) -> None:
    assert short(16384, uses, other) == lacking


def test_the_most_recent_burst_goes_first_and_only_as_many_as_needed() -> None:
    bursts = [Bursting("early", 0.0, 3000), Bursting("late", 10.0, 3000),
              Bursting("idle", 20.0, 0)]
    assert [(b.key, lacking) for b, lacking in reclaim(bursts, 2000)] == [("late", 2000)]
    assert [b.key for b, _ in reclaim(bursts, 4000)] == ["late", "early"]
    assert reclaim(bursts, 0) == []
