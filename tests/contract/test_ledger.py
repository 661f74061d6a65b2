"""GPULedger entries as every writer reads them (``gpupool.contract.ledger``): a hold lives
until its expiry, its times round-trip, and an undecodable entry is left out and told."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract.devices import parse_time
from gpupool.contract.ledger import HOLD, Entry, live_hold, stamp, view_of
from gpupool.core.allocation import Allocation, Slice

T = 1767225600.0


def hold(expires: float) -> Entry:
    alloc = Allocation("uid-p", "g1", 0, 0, (Slice("GPU-g1-0", 0, 1024, 0),))
    return Entry(alloc, "lab/p", stamp(T), kind=HOLD, expires=stamp(expires), displaces=("v",))


def test_a_hold_lives_until_its_expiry_and_a_bind_is_never_a_live_hold() -> None:
    entry = hold(T + 120)
    assert live_hold(entry, T) and live_hold(entry, T + 120)
    assert not live_hold(entry, T + 120.5)
    assert not live_hold(Entry(entry.allocation, "lab/p", stamp(T)), T)


def test_stamped_times_read_back_to_the_microsecond() -> None:
    assert parse_time(stamp(T + 0.25)) == T + 0.25


def test_an_undecodable_entry_is_left_out_and_told() -> None:
    told: list[str] = []
    obj = {"metadata": {"name": "g1", "resourceVersion": "7"},
           "spec": {"node": "g1", "entries": {"uid-p": hold(T + 1).to_json(),
                                              "uid-bad": {"kind": "lease"}}}}
    view = view_of(obj, warn=told.append)
    assert list(view.entries) == ["uid-p"] and view.entries["uid-p"].displaces == ("v",)
    assert view.resource_version == "7"
    assert len(told) == 1 and told[0].startswith("GPULedger g1: ") and "uid-bad" in told[0]


@pytest.mark.parametrize("obj", [{"metadata": "x", "spec": "y"}, {"spec": {"entries": "z"}},
                                 {"metadata": {"name": "g1"}, "spec": None}])
def test_a_ledger_whose_parts_are_not_maps_reads_as_empty(obj: dict[str, Any]) -> None:
    told: list[str] = []
    assert view_of(obj, warn=told.append).entries == {}
