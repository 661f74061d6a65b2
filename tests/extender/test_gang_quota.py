"""A gang's holds are charged in the QuotaLedgers (FAKE API server, real client): two
replicas placing gangs of one tenant at the same moment never take it past its quota, a
member's bind replaces its hold's charge without charging it twice, and the charges end
with the holds (timeout, a member deleted) — docs/gangs.md."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.state.ledger import view_of
from tests.waiting import wait_for

from .builders import Replica, pod_obj, schedule, seed_cluster
from .test_gangs import GPU, Clock, answer_of, holds, reasons, replica_of, seed_gang, seen

LIMIT = 4  # GPUs of tenant lab; each gang below asks 3


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.seed("tenantquotas", {"metadata": {"name": "lab"},
                                     "spec": {"namespaces": ["lab"], "limits": {"gpus": LIMIT}}})
        yield server


def charged(fake: FakeApiServer) -> dict[str, str]:
    """Pod uid -> kind of every entry of the tenant's QuotaLedger."""
    obj = fake.get("quotaledgers", "tenant.lab")
    return {} if obj is None else {u: "hold" if e.is_hold else "bind"
                                   for u, e in view_of(obj).entries.items()}


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def lagging(fake: FakeApiServer, count: int, gangs: list[list[dict[str, Any]]],
            clock: Any = None) -> list[Replica]:
    """Replicas that have seen the quota and the gangs, then see nothing more (the worst
    watch lag: none sees another's holds)."""
    replicas = [replica_of(fake, f"r{k}", clock) for k in range(count)]
    members = [p for g in gangs for p in g]
    for r in replicas:
        assert wait_for(lambda r=r: len(r.cache.catalogue.tenants) == 1 and  # type: ignore[misc]
                        seen(r, members, groups=len(gangs)))
        r.feeds.stop(timeout_s=30.0)
    return replicas


def test_a_gang_held_by_one_replica_keeps_another_replicas_gang_within_the_quota(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)  # 8 GPUs: room is never what stops them
    a = seed_gang(fake, "a", 3, GPU, ns="lab")
    b = seed_gang(fake, "b", 3, GPU, ns="lab")
    one, two = lagging(fake, 2, [a, b])
    try:
        assert len(answer_of(one, a[0], nodes)["NodeNames"]) == 1
        assert charged(fake) == dict.fromkeys(uids(a), "hold")
        answer = answer_of(two, b[0], nodes)  # its cache shows no hold of a
        assert answer["NodeNames"] == []
        (why,) = reasons(answer)
        assert "gang PodGroup lab/b: quota of tenant lab exceeded: 3 GPUs asked, 3 of 4 in " \
               "use, 1 left" in why
        assert set(holds(fake)) == uids(a)  # b holds nothing, on no node
        assert charged(fake) == dict.fromkeys(uids(a), "hold")
    finally:
        one.close()
        two.close()


def test_two_replicas_racing_to_hold_two_gangs_of_one_tenant_never_exceed_its_quota(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    gangs = [seed_gang(fake, name, 3, GPU, ns="lab") for name in ("a", "b", "c", "d")]
    replicas = lagging(fake, 2, gangs)
    barrier = threading.Barrier(4)

    def race(replica: Replica, pod: dict[str, Any]) -> None:
        barrier.wait()
        answer_of(replica, pod, nodes)

    try:
        threads = [threading.Thread(target=race, args=(replicas[k % 2], g[0]))
                   for k, g in enumerate(gangs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = set(holds(fake))
        assert held in [uids(g) for g in gangs]  # one gang, whole: 3 of 4 GPUs
        assert charged(fake) == dict.fromkeys(held, "hold")
    finally:
        for r in replicas:
            r.close()


def test_members_binding_to_their_holds_are_charged_once(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    gang = seed_gang(fake, "train", LIMIT, GPU, ns="lab")  # exactly the quota
    replica = replica_of(fake)
    try:
        assert wait_for(lambda: seen(replica, gang) and
                        len(replica.cache.catalogue.tenants) == 1)
        held = holds(fake) if answer_of(replica, gang[0], nodes)["NodeNames"] else {}
        assert set(held) == uids(gang)
        for pod in gang:  # each bind counts the others' holds, never its own as well
            assert schedule(replica.extender, pod, nodes) == (held[pod["metadata"]["uid"]], "")
        assert charged(fake) == dict.fromkeys(uids(gang), "bind")
    finally:
        replica.close()


def test_a_gangs_charges_stop_counting_at_its_timeout(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 2, 4)
    clock = Clock()
    gang = seed_gang(fake, "slow", 3, GPU, ns="lab")
    plain = [fake.seed("pods", pod_obj(f"p{k}", {"gpupool.io/gpu": "2"}, ns="lab"))
             for k in range(2)]
    one, two = lagging(fake, 2, [gang], clock)
    try:
        assert wait_for(lambda: all(p["metadata"]["uid"] in two.cache.unbound for p in plain))
        assert len(answer_of(one, gang[0], nodes)["NodeNames"]) == 1
        error = schedule(two.extender, plain[0], nodes)[1]  # 3 held + 2 > 4, seen nowhere
        assert "quota of tenant lab exceeded: 2 GPUs asked, 3 of 4 in use, 1 left" in error
        clock.now += 61.0  # past the gang's timeout: its holds and charges end
        two.cache.sweep()
        assert schedule(two.extender, plain[1], nodes)[1] == ""
        assert charged(fake)[plain[1]["metadata"]["uid"]] == "bind"
    finally:
        one.close()
        two.close()


def test_a_gang_that_can_no_longer_complete_gives_its_charges_back(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 4)
    gang = seed_gang(fake, "train", 3, GPU, ns="lab")
    replica = replica_of(fake)
    try:
        assert wait_for(lambda: seen(replica, gang) and
                        len(replica.cache.catalogue.tenants) == 1)
        assert len(answer_of(replica, gang[0], nodes)["NodeNames"]) == 1
        bound = gang[0]["metadata"]["uid"]
        assert schedule(replica.extender, gang[0], nodes)[1] == ""
        fake.delete("pods", gang[2]["metadata"]["name"], "lab")
        assert wait_for(lambda: gang[2]["metadata"]["uid"] not in replica.cache.gangs.gang_of)
        assert replica.extender.sweep_gangs() == ["PodGroup lab/train"]
        assert holds(fake) == {}
        assert charged(fake) == {bound: "bind"}  # the bound member's charge stays
    finally:
        replica.close()
