"""Preemption for remote slices reserves the room it makes: the controller writes the
preemptor's hold in the serving node's GPULedger (kind hold, expires, displaces = the
victims) before it asks any eviction; a pod that has a hold already gets no second one
(a second round, a new leader); a conflict on the write, or a ledger without room (another
pod's hold counted), evicts nobody that round; a refused eviction removes the hold."""

from __future__ import annotations

from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.contract.ledger import HOLD, Entry, stamp, view_of
from gpupool.controller.remoteledgers import REDRIVE_S
from gpupool.core.allocation import Allocation, Slice
from gpupool.kube.controller_ops import ControllerApi
from tests.rbac_grants import grants, manifest, needed, refused, writes

from .builders import GIB
from .test_remote_preemption_api import LATER, World, evictions, fake, fill, pods, victim, waiting

__all__ = ["fake"]  # the fixture


def ledger_writes(fake: FakeApiServer) -> list[int]:
    """The indices in ``fake.requests`` of GPULedger writes."""
    return [i for i, (m, p) in enumerate(fake.requests)
            if m in ("POST", "PATCH") and "/gpuledgers" in p]


def eviction_at(fake: FakeApiServer) -> list[int]:
    return [i for i, (m, p) in enumerate(fake.requests)
            if m == "POST" and p.endswith("/eviction")]


def entries(fake: FakeApiServer, node: str) -> dict[str, Any]:
    obj = fake.get("gpuledgers", node)
    return dict((obj or {}).get("spec", {}).get("entries") or {})


def seeded_hold(fake: FakeApiServer, uid: str, pod: str, node: str, mib: int,
                displaces: tuple[str, ...] = (), expires: float = LATER + 600) -> None:
    alloc = Allocation(uid, node, 0, 0, (Slice(f"GPU-{node}-0", 0, mib, 10),))
    entry = Entry(alloc, pod, stamp(LATER), kind=HOLD, expires=stamp(expires),
                  displaces=displaces)
    fake.seed("gpuledgers", {"apiVersion": names.API_VERSION, "kind": "GPULedger",
                             "metadata": {"name": node},
                             "spec": {"node": node, "entries": {uid: entry.to_json()}}})


def scene(fake: FakeApiServer) -> None:
    """Only a (priority 1, all of g1's GPU) stands between big (40 GiB) and room."""
    fill(fake, "g2", "g3")
    fake.seed("pods", victim("a", "g1", 80 * GIB, 1))
    fake.seed("pods", waiting("big", 40 * GIB))


def test_the_hold_is_in_the_serving_nodes_ledger_before_any_eviction(
        fake: FakeApiServer) -> None:
    scene(fake)
    world = World(fake)
    try:
        world.round()
    finally:
        world.close()
    assert pods(fake) == {"big"}
    (write,), (evicted,) = ledger_writes(fake), eviction_at(fake)
    assert write < evicted
    view = view_of(fake.get("gpuledgers", "g1") or {})
    entry = view.entries["uid-lab-big"]
    assert entry.is_hold and entry.pod == "lab/big" and entry.displaces == ("uid-low-a",)
    assert entry.expires_s is not None and entry.bind_s is not None
    assert entry.expires_s - entry.bind_s == 120.0  # the extender's --preemption-hold
    assert [(s.gpu_uuid, s.memory_mib) for s in entry.allocation.slices] == \
        [("GPU-g1-0", 40 * GIB)]
    assert entry.allocation.node == "g1"


def test_a_new_leader_writes_no_second_hold_and_evicts_nobody_while_the_hold_is_young(
        fake: FakeApiServer) -> None:
    """The last leader wrote big's hold, then stopped before evicting: its victim a still
    runs. A fresh controller finds the hold: big's room is held, nothing is planned for it
    until the hold is old enough that its evictions should have been seen."""
    scene(fake)
    seeded_hold(fake, "uid-lab-big", "lab/big", "g1", 40 * GIB, ("uid-low-a",))
    world = World(fake)
    try:
        plan = world.round()
        world.clock.now += REDRIVE_S - 2
        later = world.round()
    finally:
        world.close()
    assert plan.preemptions == () == later.preemptions
    assert later.next_s is not None and later.next_s <= LATER + REDRIVE_S
    assert ledger_writes(fake) == [] and evictions(fake) == [] and pods(fake) == {"a", "big"}


def test_a_new_leader_evicts_the_victims_of_a_hold_whose_evictions_were_never_sent(
        fake: FakeApiServer) -> None:
    scene(fake)
    seeded_hold(fake, "uid-lab-big", "lab/big", "g1", 40 * GIB, ("uid-low-a",))
    world = World(fake)
    world.clock.now = LATER + REDRIVE_S + 1
    try:
        plan = world.round()
        world.clock.now += 1
        world.round()  # a is leaving now: evicted once
    finally:
        world.close()
    assert [(p.preemptor.name, p.written, [v.name for v in p.victims])
            for p in plan.preemptions] == [("big", True, ["a"])]
    assert ledger_writes(fake) == [] and len(evictions(fake)) == 1 and pods(fake) == {"big"}
    assert set(entries(fake, "g1")) == {"uid-lab-big"} and world.count("evicted") == 1


def test_an_old_hold_whose_victims_are_already_leaving_is_not_driven_again(
        fake: FakeApiServer) -> None:
    fill(fake, "g2", "g3")
    leaving = victim("a", "g1", 80 * GIB, 1)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:59:00Z"
    fake.seed("pods", leaving)
    fake.seed("pods", waiting("big", 40 * GIB))
    seeded_hold(fake, "uid-lab-big", "lab/big", "g1", 40 * GIB, ("uid-low-a",))
    world = World(fake)
    world.clock.now = LATER + REDRIVE_S + 1
    try:
        plan = world.round()
    finally:
        world.close()
    assert plan.preemptions == () and evictions(fake) == [] and ledger_writes(fake) == []


def test_two_rounds_of_one_controller_write_one_hold(fake: FakeApiServer) -> None:
    scene(fake)
    fake.seed("pods", victim("b", "g2", 80 * GIB, 1))  # room it could take a second time
    world = World(fake)
    try:
        world.round()
        world.clock.now += 1
        world.round()
    finally:
        world.close()
    assert len(ledger_writes(fake)) == 1 and len(evictions(fake)) == 1


def test_a_conflict_on_the_ledger_write_evicts_nobody_and_a_later_round_plans_again(
        fake: FakeApiServer) -> None:
    scene(fake)
    fake.fail_next("POST", "gpuledgers", 409, "the object has been modified")
    world = World(fake)
    try:
        world.round()
        assert evictions(fake) == [] and pods(fake) == {"a", "big"}
        assert world.count("unheld") == 1
        world.clock.now += 1
        world.round()
    finally:
        world.close()
    assert pods(fake) == {"big"} and len(evictions(fake)) == 1
    assert entries(fake, "g1")["uid-lab-big"]["kind"] == HOLD


def test_another_pods_live_hold_is_counted_no_eviction_for_room_it_takes(
        fake: FakeApiServer) -> None:
    """g1's ledger holds 60 GiB for pod other: evicting a would not make big's 40 GiB. The
    planner counts the hold (the state cannot take it beside a: g1 is not planned on)."""
    scene(fake)
    seeded_hold(fake, "uid-lab-other", "lab/other", "g1", 60 * GIB)
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert evictions(fake) == [] and pods(fake) == {"a", "big"} and ledger_writes(fake) == []
    assert set(entries(fake, "g1")) == {"uid-lab-other"} and world.count("unheld") == 0
    assert [s.pod for s in plan.skipped] == ["lab/big"] and world.count("no-victims") == 1


def test_a_live_hold_of_another_pod_on_the_only_gpu_leaves_its_victims_alone_and_says_why(
        fake: FakeApiServer) -> None:
    """other's hold takes all of g1 and displaces a (being evicted for other): a is
    nobody else's victim, and big is told that the room is other's."""
    scene(fake)
    seeded_hold(fake, "uid-lab-other", "lab/other", "g1", 80 * GIB, ("uid-low-a",))
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert plan.preemptions == () and evictions(fake) == [] and ledger_writes(fake) == []
    (skip,) = plan.skipped
    assert skip.pod == "lab/big" and "lab/other on node g1" in skip.reason
    assert world.count("unheld") == 0 and world.count("no-victims") == 1


def test_an_expired_hold_displacing_the_victim_plans_it_again(fake: FakeApiServer) -> None:
    scene(fake)
    seeded_hold(fake, "uid-lab-other", "lab/other", "g1", 80 * GIB, ("uid-low-a",),
                expires=LATER - 1)
    world = World(fake)
    try:
        plan = world.round()
    finally:
        world.close()
    assert [[v.name for v in p.victims] for p in plan.preemptions] == [["a"]]
    assert pods(fake) == {"big"} and set(entries(fake, "g1")) == {"uid-lab-big"}


def test_the_hold_of_a_pod_already_bound_counts_nothing(fake: FakeApiServer) -> None:
    scene(fake)
    fake.seed("pods", {"metadata": {"name": "other", "namespace": "lab",
                                    "uid": "uid-lab-other"},
                       "spec": {"nodeName": "c1", "containers": [{"name": "m", "image": "x"}]},
                       "status": {"phase": "Running"}})
    seeded_hold(fake, "uid-lab-other", "lab/other", "g1", 80 * GIB, ("uid-low-a",))
    world = World(fake)
    try:
        world.round()
    finally:
        world.close()
    assert pods(fake) == {"big", "other"} and len(evictions(fake)) == 1


def test_an_expired_hold_of_another_pod_counts_nothing_and_is_dropped(
        fake: FakeApiServer) -> None:
    scene(fake)
    seeded_hold(fake, "uid-lab-other", "lab/other", "g1", 60 * GIB, expires=LATER - 1)
    world = World(fake)
    try:
        world.round()
    finally:
        world.close()
    assert pods(fake) == {"big"} and set(entries(fake, "g1")) == {"uid-lab-big"}


def test_a_refused_eviction_removes_the_hold(fake: FakeApiServer) -> None:
    scene(fake)
    fake.fail_next("POST", "eviction", 429, "Cannot evict pod as it would violate the pod's "
                                            "disruption budget.")
    world = World(fake)
    try:
        world.round()
    finally:
        world.close()
    assert pods(fake) == {"a", "big"} and world.count("blocked") == 1
    assert "uid-lab-big" not in entries(fake, "g1")
    write, removal = ledger_writes(fake)
    assert write < eviction_at(fake)[0] < removal


def test_the_controller_needs_only_its_granted_ledger_rights(fake: FakeApiServer) -> None:
    scene(fake)
    world = World(fake)
    try:
        world.round()
    finally:
        world.close()
    calls = needed(fake.requests)
    assert refused(calls, grants(manifest("controller", "rbac.yaml"),
                                 "gpupool-controller")) == set()
    assert ("gpupool.io", "gpuledgers") in writes(calls)


def test_the_hold_lasts_what_the_controller_flag_says(fake: FakeApiServer) -> None:
    """``--remote-preemption-hold``, default the extender's ``--preemption-hold`` (120)."""
    from gpupool.cli.controller_run import _remote_preemptor
    from gpupool.cli.main import build_parser
    from gpupool.controller.metrics import ControllerMetrics

    api = ControllerApi.open(server=fake.url)
    try:
        holds = {}
        for extra in ([], ["--remote-preemption-hold", "45"]):
            args = build_parser().parse_args(["controller", "--remote-provider", "stub",
                                              *extra])
            made = _remote_preemptor(args, api, ControllerMetrics())
            assert made is not None
            holds[tuple(extra)] = made.holds.hold_s
    finally:
        api.close()
    assert holds == {(): 120.0, ("--remote-preemption-hold", "45"): 45.0}


def test_the_pods_own_expired_hold_counts_none_of_its_victims_out(fake: FakeApiServer) -> None:
    """Its new hold replaces it: a pod the old hold displaced, still running and not among
    the new victims, still holds its room (else an over-committing hold is written)."""
    from gpupool.controller import remotewaiting
    from gpupool.controller.loop import Controller
    from gpupool.controller.remotepreempt import Preemption, Victim

    from .builders import verify

    fill(fake, "g2", "g3")
    pod = waiting("big", 80 * GIB)
    for p in (victim("a1", "g1", 40 * GIB, 1), victim("a2", "g1", 40 * GIB, 2), pod):
        fake.seed("pods", p)

    def bound(uid: str) -> dict[str, Any]:
        return Entry(Allocation(uid, "g1", 0, 0, (Slice("GPU-g1-0", 0, 40 * GIB, 10),)),
                     "low/x", stamp(LATER - 1000)).to_json()
    old = Entry(Allocation("uid-lab-big", "g1", 0, 0, (Slice("GPU-g1-0", 0, 40 * GIB, 10),)),
                "lab/big", stamp(LATER - 500), kind=HOLD, expires=stamp(LATER - 300),
                displaces=("uid-low-a1",))
    fake.seed("gpuledgers", {"apiVersion": names.API_VERSION, "kind": "GPULedger",
                             "metadata": {"name": "g1"}, "spec": {"node": "g1", "entries": {
                                 "uid-low-a1": bound("uid-low-a1"),
                                 "uid-low-a2": bound("uid-low-a2"),
                                 "uid-lab-big": old.to_json()}}})
    world = World(fake)
    try:
        observed = Controller(world.api, verify=verify).list_world()
        (w,), _, _ = remotewaiting.waiting([pod], LATER, 30.0)
        hold = Allocation(w.uid, "g1", 0, 0, (Slice("GPU-g1-0", 0, 80 * GIB, 10),))
        a2_only = Preemption(w, "g1", "own node", (Victim("uid-low-a2", "low", "a2", "g1", 2),),
                             hold)
        written = world.preemptor.holds.write(a2_only, world.preemptor.holds.read()["g1"],
                                              observed, LATER)
    finally:
        world.close()
    assert written.view is None and "has no room" in written.why
