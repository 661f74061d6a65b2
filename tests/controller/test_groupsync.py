"""Automatic resource groups planned by the controller, members and conflicts in status,
permissions applied in planning — against the FAKE API server with the real client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.controller.loop import Controller
from gpupool.kube.controller_ops import ControllerApi
from tests.controller.builders import GIB, device, group, placed_pod, sign, slices, verify

WRITES = ("POST", "PUT", "PATCH", "DELETE")


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api(fake: FakeApiServer) -> Iterator[ControllerApi]:
    client = ControllerApi.open(server=fake.url)
    yield client
    client.close()


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "status": {}}


def seed_nodes(fake: FakeApiServer) -> None:
    """a1, a2: four A100s each in zone a; t1: two T4s in zone b."""
    for name in ("a1", "a2"):
        fake.seed("nodes", node(name, zone="a"))
        for i in range(4):
            fake.seed("gpudevices", device(name, i))
    fake.seed("nodes", node("t1", zone="b"))
    for i in range(2):
        fake.seed("gpudevices", device("t1", i, "T4", 16 * GIB))


def auto(name: str, **spec: Any) -> dict[str, Any]:
    return group(name, mode="automatic", **spec)


def status(fake: FakeApiServer, name: str) -> dict[str, Any]:
    found = fake.get("resourcegroups", name)
    assert found is not None
    result: dict[str, Any] = found.get("status") or {}
    return result


def rounds(api: ControllerApi, n: int = 1) -> None:
    for _ in range(n):
        out = Controller(api, verify=verify).reconcile_once()
        assert out.failures == []


def test_an_automatic_group_gets_members_of_its_model_best_fit_and_status_says_so(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_nodes(fake)
    fake.seed("resourcegroups", auto("team-a", models=["A100-SXM4-80GB"], demand={"gpus": 3},
                                     tenants=["team-a"]))
    rounds(api, 2)  # the second round's member count reads what the first one planned
    s = status(fake, "team-a")
    assert len(s["members"]["gpus"]) == 3 and len(s["members"]["nodes"]) == 1
    assert all(u.startswith("GPU-a") for u in s["members"]["gpus"])
    assert s["capacity"] == {"gpus": 3} and s["free"] == {"gpus": 3} and "unmet" in s
    assert s["unmet"] == {"gpus": 0}
    assert s["gpus"] == 3  # the reconciler's member count reads the planned members
    assert "conflicts" not in s


def test_a_plan_stays_as_it_is_when_nothing_changed(fake: FakeApiServer,
                                                    api: ControllerApi) -> None:
    seed_nodes(fake)
    fake.seed("resourcegroups", auto("team-a", demand={"sharePct": 50}))
    rounds(api, 2)
    first = status(fake, "team-a")["members"]
    assert len(first["gpus"]) == 5  # half of 10 GPUs, rounded up
    before = len([r for r in fake.requests if r[0] in WRITES])
    rounds(api, 2)
    assert status(fake, "team-a")["members"] == first
    assert len([r for r in fake.requests if r[0] in WRITES]) == before


def test_a_plan_follows_a_changed_demand_and_a_vanished_gpu_but_keeps_busy_gpus(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_nodes(fake)
    fake.seed("resourcegroups", auto("g", models=["A100-SXM4-80GB"], demand={"gpus": 4}))
    rounds(api)
    members = status(fake, "g")["members"]["gpus"]
    busy = members[0]
    node_name, index = busy.split("-")[1], int(busy.split("-")[2])
    fake.seed("pods", sign(placed_pod("p", "lab", node_name,
                                      slices(node_name, (index, GIB, 10)), group_name="g")))
    fake.patch("resourcegroups", "g", {"spec": {"demand": {"gpus": 1}}})
    rounds(api)
    assert status(fake, "g")["members"]["gpus"] == [busy]  # the idle ones went
    assert status(fake, "g")["free"] == {"gpus": 0}
    fake.patch("resourcegroups", "g", {"spec": {"demand": {"gpus": 2}}})
    rounds(api)
    grown = status(fake, "g")["members"]["gpus"]
    assert busy in grown and len(grown) == 2
    other = next(u for u in grown if u != busy)
    fake.delete("gpudevices", other.lower())
    rounds(api)
    again = status(fake, "g")["members"]["gpus"]
    assert other not in again and busy in again and len(again) == 2


def test_groups_that_may_not_share_never_get_the_same_gpu_and_manual_overlaps_are_reported(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_nodes(fake)
    fake.seed("resourcegroups", group("fixed", nodes=["a1"]))
    fake.seed("resourcegroups", group("overlap", gpus=["GPU-a1-0"]))
    fake.seed("resourcegroups", auto("auto", models=["A100-SXM4-80GB"], demand={"gpus": 8}))
    rounds(api)
    planned = set(status(fake, "auto")["members"]["gpus"])
    assert planned == {f"GPU-a2-{i}" for i in range(4)}
    assert status(fake, "auto")["unmet"] == {"gpus": 4}
    assert status(fake, "fixed")["conflicts"] == [
        "GPU GPU-a1-0 on node a1 is also in group overlap"]
    assert status(fake, "overlap")["conflicts"] == [
        "GPU GPU-a1-0 on node a1 is also in group fixed"]


def test_shareable_groups_may_share_gpus(fake: FakeApiServer, api: ControllerApi) -> None:
    seed_nodes(fake)
    fake.seed("resourcegroups", group("fixed", nodes=["t1"], shareable=True))
    fake.seed("resourcegroups", auto("auto", models=["T4"], demand={"gpus": 2},
                                     shareable=True))
    rounds(api)
    assert status(fake, "auto")["members"]["gpus"] == ["GPU-t1-0", "GPU-t1-1"]
    assert "conflicts" not in status(fake, "fixed")


def test_planning_takes_only_gpus_the_tenants_are_permitted_and_on_selected_nodes(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_nodes(fake)
    fake.seed("nodes", node("a3", zone="c"))
    for i in range(4):
        fake.seed("gpudevices", device("a3", i))
    fake.seed("gpupermissions", {"metadata": {"name": "lab-zone-a"}, "spec": {
        "tenants": ["lab"], "nodeSelector": {"matchLabels": {"zone": "a"}}}})
    fake.seed("resourcegroups", auto("lab", tenants=["lab"], demand={"gpus": 6},
                                     nodeSelector={"matchExpressions": [
                                         {"key": "zone", "operator": "In",
                                          "values": ["a", "c"]}]}))
    rounds(api)
    planned = status(fake, "lab")["members"]["gpus"]
    assert len(planned) == 6 and all(u.startswith(("GPU-a1", "GPU-a2")) for u in planned)
    perm = fake.get("gpupermissions", "lab-zone-a")
    assert perm is not None and perm["status"]["gpus"] == 8


def test_a_broken_automatic_group_keeps_its_members_and_says_why(
        fake: FakeApiServer, api: ControllerApi) -> None:
    seed_nodes(fake)
    fake.seed("resourcegroups", auto("g", demand={"gpus": 2}))
    rounds(api)
    members = status(fake, "g")["members"]
    fake.patch("resourcegroups", "g", {"spec": {"demand": {"gpus": "two"}}})
    rounds(api)
    assert status(fake, "g")["members"] == members


def test_the_controller_runs_on_without_the_tenancy_crds_and_plans_nothing_meanwhile(
        fake: FakeApiServer, api: ControllerApi) -> None:
    import threading

    from tests.waiting import wait_for

    seed_nodes(fake)
    fake.seed("resourcegroups", auto("g", demand={"gpus": 2}))
    for _ in range(50):  # a CRD that is not applied: 404 to every listing
        fake.fail_next("GET", "/gpupermissions", 404, "the server could not find the resource")
    rounds_seen: list[object] = []
    stop = threading.Event()
    thread = threading.Thread(target=Controller(api, verify=verify).run,
                              args=(stop, 60.0, rounds_seen.append, 1))
    thread.start()
    try:
        assert wait_for(lambda: rounds_seen)  # it reconciles the rest
        assert wait_for(lambda: "Valid" in str(status(fake, "g").get("conditions")))
        assert "members" not in status(fake, "g")  # not planned on half a world
    finally:
        stop.set()
        thread.join(10)
