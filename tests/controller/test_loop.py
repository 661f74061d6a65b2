"""The controller loop against the FAKE API server over loopback HTTP, with the real client."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.cli.main import main
from gpupool.controller.defaults import MANAGED_BY
from gpupool.controller.loop import Controller, Outcome
from gpupool.kube.controller_ops import ControllerApi
from tests.controller.builders import (
    GIB,
    device,
    group,
    model_selector,
    placed_pod,
    resource_class,
    sign,
    slices,
    verify,
)

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


def seed_world(fake: FakeApiServer) -> dict[str, Any]:
    """Two A100s on n1, one T4 on n2; a user class, a broken class, two groups, pods."""
    for obj in (device("n1", 0), device("n1", 1), device("n2", 0, "T4", 16 * GIB)):
        fake.seed("gpudevices", obj)
    user_t4 = resource_class("t4", {"matchLabels": {"gpupool.io/model": "T4"}})
    del user_t4["metadata"]["resourceVersion"]
    fake.seed("resourceclasses", user_t4)
    fake.seed("resourceclasses", {"metadata": {"name": "bad"}, "spec": {"selector": {
        "matchExpressions": [{"key": "gpupool.io/memory", "operator": "Gt",
                              "values": ["ten gigs"]}]}}})
    fake.seed("resourcegroups", group("team", nodes=["n1"], tenants=["lab"],
                                      quota={"gpus": 2, "corePct": 150}))
    fake.seed("resourcegroups", group("typo", quota={"gpu": 2}))
    fake.seed("pods", placed_pod("a", "lab", "n1", slices("n1", (0, 80 * GIB, 100)),
                                 exclusive=True, group_name="team"))
    fake.seed("pods", placed_pod("b", "lab", "n1", slices("n1", (1, 10 * GIB, 25)),
                                 group_name="team"))
    broken = placed_pod("c", "lab", "n1", slices("n1", (1, GIB, 5)), group_name="team")
    broken["metadata"]["annotations"]["gpupool.io/allocation"] = '{"v": 1}'
    sign(broken)  # signed as it is: a record gpupool wrote and cannot read back
    fake.seed("pods", broken)
    return copy.deepcopy(fake.get("resourceclasses", "t4") or {})


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    assert obj is not None
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def test_once_creates_defaults_validates_and_writes_quota_then_is_a_no_op(
        fake: FakeApiServer, api: ControllerApi) -> None:
    user_t4 = seed_world(fake)
    controller = Controller(api, clock=lambda: "2026-01-02T03:04:05Z", verify=verify)
    first = controller.reconcile_once()
    assert first.failures == []
    assert first.created == ["a100-sxm4-80gb"]
    a100 = fake.get("resourceclasses", "a100-sxm4-80gb")
    assert a100 is not None and a100["metadata"]["labels"][MANAGED_BY] == "gpupool-controller"
    assert a100["spec"]["selector"] == model_selector("A100-SXM4-80GB")
    assert a100["status"]["gpus"] == 2
    # the user's class keeps its spec and labels; only its status was written
    t4 = fake.get("resourceclasses", "t4")
    assert t4 is not None and t4["spec"] == user_t4["spec"]
    assert t4["metadata"].get("labels") == user_t4["metadata"].get("labels")
    assert t4["status"]["gpus"] == 1
    bad = cond(fake.get("resourceclasses", "bad"), "Valid")
    assert (bad["status"], bad["reason"]) == ("False", "InvalidSelector")
    assert "ten gigs" in bad["message"]
    team = fake.get("resourcegroups", "team")
    assert team is not None
    assert team["status"]["quota"] == {
        "allocated": {"gpus": 2, "memoryMiB": 90 * GIB, "corePct": 125},
        "limit": {"gpus": 2, "corePct": 150},
        "remaining": {"gpus": 0, "corePct": 25},
    }
    assert cond(team, "WithinQuota")["status"] == "True"
    [unaccounted] = team["status"]["unaccountedPods"]
    assert "uid-lab-c" in unaccounted
    typo = cond(fake.get("resourcegroups", "typo"), "Valid")
    assert typo["status"] == "False" and "unknown keys gpu" in typo["message"]

    seen = len(fake.requests)
    second = Controller(api, clock=lambda: "2027-01-01T00:00:00Z", verify=verify).reconcile_once()
    assert second.writes == 0 and second.failures == []
    assert [r for r in fake.requests[seen:] if r[0] in WRITES] == []


def test_a_failed_write_is_reported_and_done_on_the_next_round(
        fake: FakeApiServer, api: ControllerApi) -> None:
    fake.seed("gpudevices", device("n1", 0))
    fake.fail_next("POST", "resourceclasses", 500, "etcd is away")
    first = Controller(api, verify=verify).reconcile_once()
    assert len(first.failures) == 1 and "etcd is away" in first.failures[0]
    assert fake.get("resourceclasses", "a100-sxm4-80gb") is None
    second = Controller(api, verify=verify).reconcile_once()
    assert second.created == ["a100-sxm4-80gb"] and second.failures == []


def test_an_owned_class_edited_by_hand_is_put_back_and_one_made_by_hand_is_not(
        fake: FakeApiServer, api: ControllerApi) -> None:
    fake.seed("gpudevices", device("n1", 0))
    Controller(api, verify=verify).reconcile_once()
    fake.patch("resourceclasses", "a100-sxm4-80gb",
               {"spec": {"selector": {"matchLabels": {"oops": "1"}}}})
    assert Controller(api, verify=verify).reconcile_once().updated == ["a100-sxm4-80gb"]
    obj = fake.get("resourceclasses", "a100-sxm4-80gb")
    assert obj is not None and obj["spec"]["selector"] == model_selector("A100-SXM4-80GB")
    # a user takes it over by removing the label: then it is left alone
    fake.patch("resourceclasses", "a100-sxm4-80gb",
               {"metadata": {"labels": {MANAGED_BY: None}},
                "spec": {"selector": {"matchLabels": {"mine": "1"}}}})
    out = Controller(api, verify=verify).reconcile_once()
    assert out.updated == [] and out.deleted == []
    obj = fake.get("resourceclasses", "a100-sxm4-80gb")
    assert obj is not None and obj["spec"]["selector"]["matchLabels"] == {"mine": "1"}


def test_the_watching_loop_follows_changes_and_settles(fake: FakeApiServer,
                                                        api: ControllerApi) -> None:
    fake.seed("gpudevices", device("n1", 0))
    stop = threading.Event()
    rounds: list[Outcome] = []
    thread = threading.Thread(target=Controller(api, verify=verify).run,
                              args=(stop, 60.0, rounds.append, 2), daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: fake.get("resourceclasses", "a100-sxm4-80gb") is not None)
        fake.seed("gpudevices", device("n2", 0, "T4", 16 * GIB))
        assert wait_for(lambda: (fake.get("resourceclasses", "t4") or {}).get("status", {})
                        .get("gpus") == 1)
        fake.seed("resourcegroups", group("g", quota={"gpus": "x"}))
        assert wait_for(lambda: "status" in (fake.get("resourcegroups", "g") or {}))
        assert cond(fake.get("resourcegroups", "g"), "Valid")["status"] == "False"
        fake.seed("resourcegroups", group("team", nodes=["n1"], quota={"gpus": 4}))
        fake.seed("pods", placed_pod("a", "lab", "n1", slices("n1", (0, GIB, 10)),
                                     group_name="team"))
        assert wait_for(lambda: (fake.get("resourcegroups", "team") or {}).get("status", {})
                        .get("quota", {}).get("remaining") == {"gpus": 3})
        fake.delete("pods", "a", "lab")
        assert wait_for(lambda: (fake.get("resourcegroups", "team") or {}).get("status", {})
                        .get("quota", {}).get("remaining") == {"gpus": 4})
        # it settles: rounds without writes follow, and no write happens once settled
        assert wait_for(lambda: len(rounds) > 1 and rounds[-1].writes == 0)
        settled = len([r for r in fake.requests if r[0] in WRITES])
        time.sleep(0.8)
        assert len([r for r in fake.requests if r[0] in WRITES]) == settled
    finally:
        stop.set()
        thread.join(30)  # a hang guard: stopping is prompt
    assert not thread.is_alive()


def test_gpupool_controller_once_prints_what_it_did(fake: FakeApiServer,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    fake.seed("gpudevices", device("n1", 0))
    assert main(["controller", "--once", "--server", fake.url, "--log-level", "ERROR"]) == 0
    out = capsys.readouterr().out
    assert "created: a100-sxm4-80gb" in out
    assert "1 classes created" in out
    assert main(["controller", "--once", "--server", fake.url, "--log-level", "ERROR"]) == 0
    assert "0 classes created, 0 updated, 0 deleted, 0 statuses written" in capsys.readouterr().out


def test_gpupool_controller_without_an_api_server_fails_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["controller", "--once", "--server", "http://127.0.0.1:9", "--log-level",
                 "CRITICAL"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpupool controller: list GPUDevices: ")
