"""The real lightkube client against the fake API server, over HTTP on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.kube.api import KubeApi
from gpupool.kube.errors import AlreadyExists, Conflict, Gone, NotFound
from gpupool.kube.informer import Feed, Informer


def pod(name: str, node: str = "", ns: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def gpu_device(name: str, node: str, index: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"gpupool.io/node": node}},
            "spec": {"node": node, "uuid": name.upper(), "index": index, "model": "A100",
                     "memoryMiB": 40960}}


def test_pods_are_listed_by_node_name(fake: FakeApiServer, api: KubeApi) -> None:
    fake.seed("pods", pod("a", "n1"))
    fake.seed("pods", pod("b", "n2", ns="team"))
    fake.seed("pods", pod("c"))
    assert [p.metadata.name for p in api.list_pods(node="n1").items] == ["a"]
    assert sorted(p.metadata.name for p in api.list_pods().items) == ["a", "b", "c"]
    assert int(api.list_pods().resource_version) >= 3


def test_annotation_patch_with_stale_resource_version_is_a_conflict(
        fake: FakeApiServer, api: KubeApi) -> None:
    fake.seed("pods", pod("a"))
    first = api.get_pod("default", "a")
    api.patch_pod_annotations("default", "a", {"k": "1"}, first.metadata.resourceVersion)
    with pytest.raises(Conflict):
        api.patch_pod_annotations("default", "a", {"k": "2"}, first.metadata.resourceVersion)
    assert fake.get("pods", "a", "default")["metadata"]["annotations"] == {"k": "1"}
    api.patch_pod_annotations("default", "a", {"k": None})
    assert fake.get("pods", "a", "default")["metadata"].get("annotations") == {}


def test_binding_sets_the_node_and_copies_its_annotations(fake: FakeApiServer,
                                                          api: KubeApi) -> None:
    uid = fake.seed("pods", pod("a"))["metadata"]["uid"]
    api.bind_pod("default", "a", uid, "n1", {"gpupool.io/phase": "allocating"})
    stored = fake.get("pods", "a", "default")
    assert stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"]["gpupool.io/phase"] == "allocating"
    with pytest.raises(Conflict, match="already assigned"):
        api.bind_pod("default", "a", uid, "n2")


def test_binding_of_a_pod_with_another_uid_is_refused(fake: FakeApiServer, api: KubeApi) -> None:
    fake.seed("pods", pod("a"))
    with pytest.raises(Conflict):
        api.bind_pod("default", "a", "not-its-uid", "n1")
    with pytest.raises(NotFound):
        api.bind_pod("default", "missing", "", "n1")


def test_gpu_devices_are_created_updated_patched_and_deleted(fake: FakeApiServer,
                                                             api: KubeApi) -> None:
    created = api.create_gpu_device(gpu_device("gpu-a", "n1"))
    api.create_gpu_device(gpu_device("gpu-b", "n2"))
    with pytest.raises(AlreadyExists):
        api.create_gpu_device(gpu_device("gpu-a", "n1"))
    assert [d["metadata"]["name"] for d in api.list_gpu_devices("n1").items] == ["gpu-a"]
    created["spec"]["model"] = "H100"
    updated = api.update_gpu_device(created)
    assert updated["spec"]["model"] == "H100"
    with pytest.raises(Conflict):
        api.update_gpu_device(created)  # carries the old resourceVersion
    status = api.patch_gpu_device_status("gpu-a", {"health": "Unhealthy", "reason": "Xid 79"})
    assert status["status"]["health"] == "Unhealthy"
    assert status["spec"]["model"] == "H100"
    api.delete_gpu_device("gpu-a")
    assert fake.get("gpudevices", "gpu-a") is None
    with pytest.raises(NotFound):
        api.get_gpu_device("gpu-a")


def test_ledger_patch_is_a_compare_and_swap(api: KubeApi) -> None:
    ledger = api.create_ledger({"metadata": {"name": "n1"}, "spec": {"entries": {}}})
    rv = ledger["metadata"]["resourceVersion"]
    api.patch_ledger("n1", {"spec": {"entries": {"u1": {"pod": "a"}}}}, rv)
    with pytest.raises(Conflict):
        api.patch_ledger("n1", {"spec": {"entries": {"u2": {"pod": "b"}}}}, rv)
    assert set(api.get_ledger("n1")["spec"]["entries"]) == {"u1"}


def test_classes_and_groups_are_listed(fake: FakeApiServer, api: KubeApi) -> None:
    fake.seed("resourceclasses", {"metadata": {"name": "a100"}, "spec": {"selector": {}}})
    fake.seed("resourcegroups", {"metadata": {"name": "team-a"}, "spec": {"nodes": ["n1"]}})
    assert [c["metadata"]["name"] for c in api.list_resource_classes().items] == ["a100"]
    assert [g["spec"]["nodes"] for g in api.list_resource_groups().items] == [["n1"]]


def test_a_watch_sees_changes_after_the_listed_version(fake: FakeApiServer, api: KubeApi) -> None:
    fake.seed("pods", pod("a", "n1"))
    rv = api.list_pods().resource_version
    fake.seed("pods", pod("b", "n1"))
    fake.seed("pods", pod("c", "n2"))
    fake.delete("pods", "a", "default")
    seen = []
    for kind, obj in api.watch_pods(rv, node="n1", timeout_s=1):
        seen.append((kind, obj.metadata.name))
        if len(seen) == 2:
            break
    assert seen == [("ADDED", "b"), ("DELETED", "a")]


def test_a_watch_from_an_expired_version_is_gone(api: KubeApi,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool_testing import fake_store
    monkeypatch.setattr(fake_store, "HISTORY", 2)
    for i in range(5):
        api.create_gpu_device(gpu_device(f"gpu-{i}", "n1", i))
    with pytest.raises(Gone):
        for _ in api.watch_gpu_devices("1", timeout_s=1):
            pass


def test_an_informer_syncs_then_follows_and_stops(fake: FakeApiServer, api: KubeApi) -> None:
    fake.seed("nodes", {"metadata": {"name": "n1"}})
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def on_sync(items: list[Any]) -> None:
        with lock:
            seen.append(("SYNC", ",".join(n.metadata.name for n in items)))

    def on_event(kind: str, obj: Any) -> None:
        with lock:
            seen.append((kind, obj.metadata.name))

    feed = Feed("nodes", lambda a: a.list_nodes(), lambda a, rv, t: a.watch_nodes(rv, t))
    informer = Informer(api, feed, on_sync, on_event, watch_timeout_s=1).start()
    assert informer.synced.wait(30)
    fake.seed("nodes", {"metadata": {"name": "n2"}})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(seen) < 2:
        time.sleep(0.01)
    informer.stop()
    assert seen[:2] == [("SYNC", "n1"), ("ADDED", "n2")]


def test_injected_failures_surface_as_kube_errors(fake: FakeApiServer, api: KubeApi) -> None:
    uid = fake.seed("pods", pod("a"))["metadata"]["uid"]
    fake.fail_next("POST", "/binding", 500, "etcd is down")
    with pytest.raises(Exception, match="etcd is down") as info:
        api.bind_pod("default", "a", uid, "n1")
    assert getattr(info.value, "code", None) == 500
    api.bind_pod("default", "a", uid, "n1")
