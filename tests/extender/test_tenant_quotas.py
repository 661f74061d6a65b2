"""Tenant quotas, class quotas and GPU permissions enforced by the extender (FAKE API
server over loopback, the real client and informers)."""

from __future__ import annotations

from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.core.reasons import for_scheduler

from .builders import Replica, gpu_obj, node_obj, pod_obj, schedule


def quota(name: str, namespaces: list[str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"namespaces": namespaces, **spec}}


def reasons(answer: dict[str, Any]) -> set[str]:
    return {r.removeprefix("gpupool: ") for r in (*answer["FailedNodes"].values(),
                                                  *answer["FailedAndUnresolvableNodes"].values())}


def test_a_tenant_quota_adds_up_its_namespaces_and_refuses_with_the_numbers(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("tenantquotas", quota("team-a", ["a-dev", "a-prod"], limits={"gpus": 3}))
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1)
    first = fake.seed("pods", pod_obj("one", {"gpupool.io/gpu": "2"}, ns="a-dev"))
    assert schedule(replica.extender, first, nodes)[1] == ""
    second = fake.seed("pods", pod_obj("two", {"gpupool.io/gpu": "2"}, ns="a-prod"))
    answer = replica.extender.filter({"Pod": second, "NodeNames": nodes})
    assert answer["NodeNames"] == []
    assert reasons(answer) == {"quota of tenant team-a exceeded: 2 GPUs asked, 2 of 3 in use, "
                               "1 left"}
    assert set(answer["FailedNodes"]) == set(nodes)  # not permanent: room may come back
    third = fake.seed("pods", pod_obj("three", {"gpupool.io/gpu": "1"}, ns="a-prod"))
    assert schedule(replica.extender, third, nodes)[1] == ""
    other = fake.seed("pods", pod_obj("other", {"gpupool.io/gpu": "2"}, ns="b"))
    assert schedule(replica.extender, other, nodes)[1] == ""  # another tenant is not limited


def test_a_request_larger_than_the_whole_quota_is_refused_as_unresolvable(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("tenantquotas", quota("small", ["s"], limits={"gpus": 1}))
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1)
    pod = fake.seed("pods", pod_obj("big", {"gpupool.io/gpu": "2"}, ns="s"))
    answer = replica.extender.filter({"Pod": pod, "NodeNames": nodes})
    assert set(answer["FailedAndUnresolvableNodes"]) == set(nodes)


def test_a_class_quota_of_a_tenant_names_the_class_and_survives_percent_formatting(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("resourceclasses", {"metadata": {"name": "a100"}, "spec": {"selector": {
        "matchLabels": {"gpupool.io/model": "A100"}}}})
    fake.seed("tenantquotas", quota("team-b", ["b"], classes={"a100": {"corePct": 60}}))
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1
                    and "a100" in replica.cache.catalogue.classes)
    limits = {"class.gpupool.io/a100": "1", "gpupool.io/gpu-memory": "4096",
              "gpupool.io/gpu-core": "40"}
    first = fake.seed("pods", pod_obj("one", limits, ns="b"))
    assert schedule(replica.extender, first, nodes)[1] == ""
    second = fake.seed("pods", pod_obj("two", limits, ns="b"))
    answer = replica.extender.filter({"Pod": second, "NodeNames": nodes})
    expected = ("quota of tenant team-b for class a100 exceeded: 40 percent of GPU compute "
                "asked, 40 of 60 in use, 20 left")
    assert reasons(answer) == {expected}
    assert for_scheduler(expected) == expected
    plain = fake.seed("pods", pod_obj("plain", {"gpupool.io/gpu-memory": "4096",
                                                "gpupool.io/gpu-core": "40"}, ns="b"))
    assert schedule(replica.extender, plain, nodes)[1] == ""  # the class limit only


def test_a_deleted_tenant_quota_stops_limiting(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("tenantquotas", quota("gone", ["g"], limits={"gpus": 0}))
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1)
    pod = fake.seed("pods", pod_obj("p", {"gpupool.io/gpu": "1"}, ns="g"))
    assert replica.extender.filter({"Pod": pod, "NodeNames": nodes})["NodeNames"] == []
    fake.delete("tenantquotas", "gone")
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 0)
    assert schedule(replica.extender, pod, nodes)[1] == ""


def test_a_broken_tenant_quota_is_ignored_and_the_extender_keeps_working(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("tenantquotas", quota("typo", ["t"], limits={"gpu": 1}))
    fake.seed("tenantquotas", quota("fine", ["f"], limits={"gpus": 0}))
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1)
    pod = fake.seed("pods", pod_obj("p", {"gpupool.io/gpu": "1"}, ns="t"))
    assert schedule(replica.extender, pod, nodes)[1] == ""


def test_a_permission_confines_a_tenant_to_its_nodes_and_names_itself(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("nodes", node_obj("z", labels={"zone": "z1"}))
    fake.seed("gpudevices", gpu_obj("z", 0))
    fake.seed("gpupermissions", {"metadata": {"name": "zone-z1"}, "spec": {
        "tenants": ["lab"], "nodeSelector": {"matchLabels": {"zone": "z1"}}}})
    assert wait_for(lambda: len(replica.cache.catalogue.permissions) == 1)
    replica.cache.assumptions.expiry_s = 0  # filter probes each pod: none goes on to a bind
    every = [*nodes, "z"]
    pod = fake.seed("pods", pod_obj("p", {"gpupool.io/gpu": "1"}, ns="lab"))
    assert replica.extender.filter({"Pod": pod, "NodeNames": every})["NodeNames"] == ["z"]
    two = fake.seed("pods", pod_obj("two", {"gpupool.io/gpu": "2"}, ns="lab"))
    answer = replica.extender.filter({"Pod": two, "NodeNames": every})
    assert answer["NodeNames"] == []
    assert answer["FailedAndUnresolvableNodes"]["z"] == (
        "gpupool: 2 GPUs of the selector permitted by GPUPermission zone-z1 needed, 1 here")
    other = fake.seed("pods", pod_obj("other", {"gpupool.io/gpu": "1"}, ns="free"))
    assert len(replica.extender.filter({"Pod": other, "NodeNames": every})["NodeNames"]) == 4


def test_a_pod_whose_class_lies_outside_its_permissions_gets_a_reason_naming_them(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("resourceclasses", {"metadata": {"name": "a100"}, "spec": {"selector": {
        "matchLabels": {"gpupool.io/model": "A100"}}}})
    fake.seed("gpupermissions", {"metadata": {"name": "t4-only"}, "spec": {
        "tenants": ["lab"], "gpuSelector": {"matchLabels": {"gpupool.io/model": "T4"}}}})
    assert wait_for(lambda: len(replica.cache.catalogue.permissions) == 1
                    and "a100" in replica.cache.catalogue.classes)
    pod = fake.seed("pods", pod_obj("p", {"class.gpupool.io/a100": "1"}, ns="lab"))
    answer = replica.extender.filter({"Pod": pod, "NodeNames": nodes})
    assert reasons(answer) == {
        "tenant lab may use no GPU of class a100 under its permissions: GPUPermission "
        "t4-only (nodes: any node; GPUs: gpupool.io/model=T4)"}
    assert set(answer["FailedAndUnresolvableNodes"]) == set(nodes)


def test_a_broken_permission_permits_its_tenants_nothing(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("gpupermissions", {"metadata": {"name": "bad"}, "spec": {
        "tenants": ["lab"], "nodeSelector": {"matchLabels": "zone=a"}}})
    assert wait_for(lambda: len(replica.cache.catalogue.permissions) == 1)
    pod = fake.seed("pods", pod_obj("p", {"gpupool.io/gpu": "1"}, ns="lab"))
    (reason,) = reasons(replica.extender.filter({"Pod": pod, "NodeNames": nodes}))
    assert reason.startswith("tenant lab may use no GPU under its permissions: "
                             "GPUPermission bad (broken, permits nothing: ")


def test_pods_of_the_same_shape_in_differently_permitted_namespaces_get_their_own_reasons(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("nodes", node_obj("z", labels={"zone": "z1"}))
    fake.seed("gpudevices", gpu_obj("z", 0))
    fake.seed("gpupermissions", {"metadata": {"name": "only-z"}, "spec": {
        "tenants": ["lab"], "nodeSelector": {"matchLabels": {"zone": "z1"}}}})
    fake.seed("gpupermissions", {"metadata": {"name": "not-z"}, "spec": {
        "tenants": ["ops"], "nodeSelector": {"matchExpressions": [
            {"key": "zone", "operator": "DoesNotExist"}]}}})
    assert wait_for(lambda: len(replica.cache.catalogue.permissions) == 2)
    replica.cache.assumptions.expiry_s = 0  # filter probes each pod: none goes on to a bind
    every = [*nodes, "z"]
    for ns, passing, refused in (("lab", ["z"], nodes[0]), ("ops", nodes, "z"),
                                 ("free", every, None)):
        pod = fake.seed("pods", pod_obj(f"p-{ns}", {"gpupool.io/gpu": "1"}, ns=ns))
        answer = replica.extender.filter({"Pod": pod, "NodeNames": every})
        assert answer["NodeNames"] == passing
        if refused is not None:
            perm = "only-z" if ns == "lab" else "not-z"
            assert answer["FailedAndUnresolvableNodes"][refused] == (
                f"gpupool: 1 GPUs of the selector permitted by GPUPermission {perm} needed, "
                "0 here")


def test_namespaces_the_controller_selected_by_label_count_for_the_tenant(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    obj = quota("team-s", [], namespaceSelector={"matchLabels": {"team": "s"}},
                limits={"gpus": 1})
    obj["spec"].pop("namespaces")
    obj["status"] = {"selectedNamespaces": ["s1", "s2", "Not A Namespace"]}
    fake.seed("tenantquotas", obj)
    assert wait_for(lambda: len(replica.cache.catalogue.tenants) == 1)
    first = fake.seed("pods", pod_obj("one", {"gpupool.io/gpu": "1"}, ns="s1"))
    assert schedule(replica.extender, first, nodes)[1] == ""
    second = fake.seed("pods", pod_obj("two", {"gpupool.io/gpu": "1"}, ns="s2"))
    assert reasons(replica.extender.filter({"Pod": second, "NodeNames": nodes})) == {
        "quota of tenant team-s exceeded: 1 GPUs asked, 1 of 1 in use, 0 left"}


def test_an_extender_starts_on_a_cluster_without_the_tenancy_crds_and_says_so(
        fake: FakeApiServer, nodes: list[str]) -> None:
    from gpupool.extender.state.cache import ClusterCache
    from gpupool.extender.state.feeds import start_feeds
    from gpupool.kube.api import KubeApi

    for _ in range(50):  # every listing answers 404, as for a CRD that is not applied
        fake.fail_next("GET", "/tenantquotas", 404, "the server could not find the resource")
    api = KubeApi.connect(server=fake.url)
    cache = ClusterCache()
    try:
        # start_feeds raises TimeoutError if a listing takes longer than sync_timeout_s (a
        # loaded machine may take seconds); the 404s list at once, as empty
        feeds = start_feeds(api, cache, watch_timeout_s=2, sync_timeout_s=30.0)
        wanted = {"tenantquotas", "gpupermissions", "pods"}  # 404: none exist, so listed
        assert wait_for(lambda: wanted <= set(cache.synced)), cache.synced
        feeds.stop(timeout_s=0.0)
    finally:
        api.close()
