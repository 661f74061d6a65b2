"""A ledger written by a compare-and-swap is taken in from what was written, decoding only
the changed entries; the result is the view a full decode of the API's answer gives."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer, merge_patch

from gpupool.contract import names
from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.state.ledger import HOLD, Entry, Ledgers, View, advanced, view_of
from gpupool.kube.api import KubeApi


def entry(uid: str, gpu: int, core: int = 20) -> Entry:
    alloc = Allocation(uid, "n1", 1000, 1024, (Slice(f"GPU-n1-{gpu}", gpu, 4096, core, "c0"),))
    return Entry(alloc, f"default/{uid}", "2026-01-01T00:00:00.000000Z", "default")


def ledger_obj(entries: dict[str, Entry], rv: str) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": "GPULedger",
            "metadata": {"name": "n1", "resourceVersion": rv},
            "spec": {"node": "n1", "entries": {u: e.to_json() for u, e in entries.items()}}}


def written(obj: dict[str, Any], changes: dict[str, Any], rv: str) -> dict[str, Any]:
    out = merge_patch(copy.deepcopy(obj), {"spec": {"entries": changes}})
    out["metadata"]["resourceVersion"] = rv
    return dict(out)


def test_an_added_entry_and_a_pruned_one_give_the_full_decode_of_the_answer() -> None:
    before = ledger_obj({f"u{k}": entry(f"u{k}", k % 4) for k in range(6)}, "10")
    changes = {"u1": None, "u4": None, "new": entry("new", 3).to_json()}
    answer = written(before, changes, "11")
    view = advanced(view_of(before), changes, answer)
    assert view == view_of(answer)
    assert view.resource_version == "11" and sorted(view.entries) == [
        "new", "u0", "u2", "u3", "u5"]


def test_a_ledger_that_did_not_exist_gets_the_one_entry_written() -> None:
    changes = {"u1": entry("u1", 0).to_json()}
    answer = ledger_obj({"u1": entry("u1", 0)}, "3")
    assert advanced(View("n1"), changes, answer) == view_of(answer)


def test_an_answer_with_entries_it_did_not_expect_is_decoded_in_full() -> None:
    before = ledger_obj({"u0": entry("u0", 0)}, "10")
    changes = {"u1": entry("u1", 1).to_json()}
    answer = written(before, {**changes, "other": entry("other", 2).to_json()}, "12")
    view = advanced(view_of(before), changes, answer)
    assert view == view_of(answer) and "other" in view.entries


def test_commits_on_the_api_server_match_what_a_fresh_read_decodes(
        fake: FakeApiServer) -> None:
    api = KubeApi.connect(server=fake.url)
    try:
        ledgers = Ledgers(api)
        view = ledgers.commit(ledgers.fetch("n1"), "u0", entry("u0", 0))
        for k in range(1, 6):
            view = ledgers.commit(view, f"u{k}", entry(f"u{k}", k % 2),
                                  prune=[f"u{k - 2}"] if k >= 2 else [])
            assert view == ledgers.fetch("n1")
        assert sorted(view.entries) == ["u4", "u5"]
    finally:
        api.close()


def test_a_hold_an_older_crd_strips_is_taken_in_as_the_bind_it_became() -> None:
    before = ledger_obj({"u0": entry("u0", 0)}, "10")
    hold = replace(entry("p", 1), kind=HOLD, expires="2026-01-01T00:02:00Z", displaces=("u0",))
    changes = {"p": hold.to_json()}
    answer = written(before, changes, "11")
    for field in ("kind", "expires", "displaces"):  # what a schema without them prunes
        del answer["spec"]["entries"]["p"][field]
    view = advanced(view_of(before), changes, answer)
    assert not view.entries["p"].is_hold and view == view_of(answer)
    kept = advanced(view_of(before), changes, written(before, changes, "11"))
    assert kept.entries["p"].is_hold and kept.entries["p"].displaces == ("u0",)


def test_a_bind_replacing_a_hold_clears_the_hold_fields_through_the_merge_patch() -> None:
    hold = replace(entry("p", 1), kind=HOLD, expires="2026-01-01T00:02:00Z", displaces=("u0",))
    with FakeApiServer() as fake:
        api = KubeApi.connect(server=fake.url)
        try:
            ledgers = Ledgers(api)
            view = ledgers.commit(View("n1"), "p", hold)
            assert view.entries["p"].is_hold
            bound = ledgers.commit(view, "p", entry("p", 1))
            stored = fake.get("gpuledgers", "n1")["spec"]["entries"]["p"]  # type: ignore[index]
            assert not bound.entries["p"].is_hold and set(stored) == set(entry("p", 1).to_json())
        finally:
            api.close()
