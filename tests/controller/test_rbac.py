"""deploy/controller/rbac.yaml allows every call the controller makes, and writes nothing else."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import yaml
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.controller.loop import Controller
from gpupool.kube.controller_ops import ControllerApi
from tests.controller.builders import GIB, device, group, model_selector, placed_pod, slices

RBAC = Path(__file__).parents[2] / "deploy" / "controller" / "rbac.yaml"


def allowed() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the ClusterRole grants."""
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "ClusterRole")
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def needed(requests: list[tuple[str, str]]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource[/sub], verb) of each request the fake server saw."""
    out = set()
    for method, path in requests:
        parts = path.strip("/").split("/")
        group_name = "" if parts[0] == "api" else parts[1]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if rest[:1] == ["namespaces"]:
            rest = rest[2:]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(
            method, "get" if len(rest) > 1 else "list")
        out.add((group_name, resource, verb))
        if verb == "list":
            out.add((group_name, resource, "watch"))  # list and watch share the path
    return out


def test_the_cluster_role_covers_what_the_controller_does_and_no_more_writes() -> None:
    with FakeApiServer() as fake:
        for obj in (device("n1", 0), device("n2", 0, "T4", 16 * GIB)):
            fake.seed("gpudevices", obj)
        fake.seed("resourceclasses", {"metadata": {"name": "k80", "labels": {
            "app.kubernetes.io/managed-by": "gpupool-controller"}},
            "spec": {"selector": model_selector("K80")}})
        fake.seed("resourcegroups", group("team", nodes=["n1"], quota={"gpus": 1}))
        fake.seed("pods", placed_pod("a", "lab", "n1", slices("n1", (0, GIB, 10)),
                                     group_name="team"))
        api = ControllerApi.open(server=fake.url)
        try:
            Controller(api).reconcile_once()
            stop = threading.Event()
            thread = threading.Thread(target=Controller(api).run, args=(stop, 60.0, None, 1))
            thread.start()
            time.sleep(1.0)
            stop.set()
            thread.join(5)
        finally:
            api.close()
        calls = needed(fake.requests)
    grants = allowed()
    assert calls - grants == set()
    writes: set[Any] = {(g, r) for g, r, v in calls if v not in ("get", "list", "watch")}
    assert writes == {("gpupool.io", "resourceclasses"), ("gpupool.io", "resourceclasses/status"),
                      ("gpupool.io", "resourcegroups/status")}
