"""The shipped RBAC of the controller, the webhook and the extender allows every call their
code makes against the API (recorded by the FAKE API server), and the writes are exactly
what each component is meant to write."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.cli.webhook import _pod_node as pod_node_of
from gpupool.contract import dra
from gpupool.controller.deviceclasses import DeviceClassSync
from gpupool.controller.leader import ElectionTiming, LeaderElector
from gpupool.controller.loop import Controller
from gpupool.extender.bind.reconcile import LedgerReconciler
from gpupool.kube.api import DraApi, KubeApi
from gpupool.kube.controller_ops import ControllerApi
from gpupool.kube.keystore import PUBLIC_CONFIG_MAP, KeyRingSource
from gpupool.kube.lease import LeaseLock
from gpupool.kube.webhook_ops import WebhookApi
from gpupool.webhook.certificates import CertificateKeeper
from gpupool.webhook.metrics import Metrics
from gpupool.webhook.namespaces import NamespaceView
from gpupool.webhook.placement import LABEL_MINIMUM
from gpupool.webhook.tls import ServingTls
from tests.controller.builders import GIB, RING, device, group, model_selector, placed_pod, slices
from tests.extender import builders as extender_builders
from tests.nodeagent.builders import NODE as AGENT_NODE
from tests.nodeagent.builders import write_gpus
from tests.nodeagent.dra.kubelet_dra import FakeDraKubelet
from tests.nodeagent.kubelet_standin import FakeKubelet
from tests.rbac_grants import Call, grants, manifest, needed, refused, writes
from tests.waiting import wait_for
from tests.webhook.conftest import PLURALS, plan, shipped_configurations

NS = "gpupool-system"


def test_the_controllers_rbac_covers_what_it_does_and_it_writes_only_statuses_and_classes(
        ) -> None:
    with FakeApiServer() as fake:
        for obj in (device("n1", 0), device("n2", 0, "T4", 16 * GIB)):
            fake.seed("gpudevices", obj)
        fake.seed("resourceclasses", {"metadata": {"name": "k80", "labels": {
            "app.kubernetes.io/managed-by": "gpupool-controller"}},
            "spec": {"selector": model_selector("K80")}})
        fake.seed("resourcegroups", group("team", nodes=["n1"], quota={"gpus": 1}))
        fake.seed("pods", placed_pod("a", "lab", "n1", slices("n1", (0, GIB, 10)),
                                     group_name="team"))
        fake.seed("configmaps", {"metadata": {"name": PUBLIC_CONFIG_MAP, "namespace": NS},
                                 "data": RING.to_data()})
        api = ControllerApi.open(server=fake.url)
        try:
            verify = KeyRingSource(api, NS, time.time).verify
            out = Controller(api, verify=verify).reconcile_once()
            assert not any("not counted" in n for n in out.notes)  # the keys were read
            stop = threading.Event()
            thread = threading.Thread(target=Controller(api, verify=verify).run,
                                      args=(stop, 60.0, None, 1))
            thread.start()
            time.sleep(1.0)
            stop.set()
            thread.join(30)
        finally:
            api.close()
        calls = needed(fake.requests)
    rules = grants(manifest("controller", "rbac.yaml"), "gpupool-controller")
    assert refused(calls, rules) == set()
    assert writes(calls) == {("gpupool.io", "resourceclasses"),
                             ("gpupool.io", "resourceclasses/status"),
                             ("gpupool.io", "resourcegroups/status")}


def test_the_webhooks_rbac_covers_making_renewing_and_publishing_its_certificate(
        tmp_path: Path) -> None:
    with FakeApiServer() as fake:
        for doc in shipped_configurations():
            fake.seed(PLURALS[doc["kind"]], doc)
        api = WebhookApi.open(server=fake.url)
        try:
            keeper = CertificateKeeper(api, plan(), ServingTls(tmp_path / "tls"),
                                       time.time, Metrics())
            keeper.refresh()  # makes the CA and the leaf, publishes the bundle
            keeper.refresh()  # steady state
            fake.delete("secrets", "gpupool-webhook-tls", NS)
            keeper.refresh()  # renewal
            fake.seed("pods", placed_pod("a", "lab", "n1", slices("n1", (0, GIB, 10))))
            assert pod_node_of(api)("lab", "a") == "n1"  # a node agent's eviction checked
            fake.seed("namespaces", {"metadata": {"name": "lab", "labels": {
                LABEL_MINIMUM: "remote-allowed"}}})
            view = NamespaceView(api.with_timeout(2.0).get_namespace_labels)
            assert view.placement_of("lab").minimum.value is not None  # not watched yet: GET
            informer = view.informer(api, watch_timeout_s=1).start()
            assert view.synced.wait(30)  # namespaces listed, then watched
            informer.stop()
        finally:
            api.close()
        calls = needed(fake.requests)
    rules = grants(manifest("webhook", "rbac.yaml"), "gpupool-webhook")
    assert refused(calls, rules) == set()
    assert writes(calls) == {("", "secrets"),
                             ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
                             ("admissionregistration.k8s.io", "validatingwebhookconfigurations")}
    assert {c.name for c in calls if c.resource == "secrets" and c.name} == \
        {"gpupool-ca", "gpupool-webhook-tls"}


def test_neither_role_can_read_the_private_signing_key_or_write_pods() -> None:
    for path, account in ((manifest("controller", "rbac.yaml"), "gpupool-controller"),
                          (manifest("webhook", "rbac.yaml"), "gpupool-webhook")):
        rules = grants(path, account)
        assert rules, f"{account} has no bound rules in {path}"
        forbidden = [Call("", "secrets", "get", NS, "gpupool-decision-signing"),
                     Call("", "secrets", "list", NS, ""),
                     Call("", "pods", "patch", "team-a", "p"),
                     Call("", "pods/binding", "create", "team-a", "p"),
                     Call("gpupool.io", "gpudevices", "update", "", "gpu-1")]
        assert refused(forbidden, rules) == set(forbidden), account


def test_the_controllers_rbac_covers_its_leader_election_on_its_own_lease_only() -> None:
    timing = ElectionTiming(lease_duration_s=2, renew_deadline_s=1.2, retry_period_s=0.25)
    with FakeApiServer() as fake:
        runs = []
        for who in ("a", "b"):
            api = KubeApi.connect(server=fake.url, timeout_s=timing.retry_period_s)
            elector = LeaderElector(LeaseLock(api, NS, "gpupool-controller"), who, timing)
            stop = threading.Event()
            thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
            thread.start()
            runs.append((api, elector, stop, thread))
        try:
            assert wait_for(lambda: any(e.is_leader() for _, e, _, _ in runs))
            # renewals, and the other one trying
            assert wait_for(lambda: {("leases", v) for v in ("create", "get", "update")} <=
                            {(c.resource, c.verb) for c in needed(list(fake.requests))})
        finally:
            for api, _, stop, thread in runs:  # the leader releases the lease on stop
                stop.set()
                thread.join(30)
                api.close()
        calls = needed(fake.requests)
    rules = grants(manifest("controller", "rbac.yaml"), "gpupool-controller")
    assert {(c.resource, c.verb) for c in calls} >= {("leases", "create"), ("leases", "get"),
                                                       ("leases", "update")}
    assert refused(calls, rules) == set()
    assert writes(calls) == {("coordination.k8s.io", "leases")}
    other = [Call("coordination.k8s.io", "leases", "update", NS, "gpupool-scheduler"),
             Call("coordination.k8s.io", "leases", "get", "kube-system", "gpupool-controller")]
    assert refused(other, rules) == set(other)


def _extender_calls(monkeypatch: pytest.MonkeyPatch) -> set[Call]:
    """The extender as ``gpupool extender`` wires it (a DRA-speaking client, so the
    ResourceSlice and ResourceClaim feeds run too) schedules four pods, preempts one of
    them for a pod of higher priority (PodDisruptionBudgets read, an eviction, Events) and
    reconciles its ledgers, with a TenantQuota and a GPUPermission in the cluster."""
    monkeypatch.setattr(extender_builders, "KubeApi", DraApi)
    with FakeApiServer() as fake:
        nodes = extender_builders.seed_cluster(fake, 2, 2)
        fake.seed("tenantquotas", {"metadata": {"name": "other", "generation": 1},
                                   "spec": {"namespaces": ["elsewhere"], "limits": {"gpus": 1}}})
        replica = extender_builders.Replica(fake)
        try:
            assert isinstance(replica.api, DraApi)
            assert wait_for(lambda: replica.cache.dra.synced ==
                            {"resourceslices", "resourceclaims"})
            for k in range(4):
                pod = fake.seed("pods", extender_builders.pod_obj(f"p{k}",
                                                                   {"gpupool.io/gpu": "1"}))
                assert extender_builders.schedule(replica.extender, pod, nodes)[1] == ""
            urgent = extender_builders.pod_obj("urgent", {"gpupool.io/gpu": "1"})
            urgent["spec"]["priority"] = 1000
            urgent = fake.seed("pods", urgent)
            assert wait_for(lambda: "budgets" in replica.cache.synced)
            extender_builders.schedule(replica.extender, urgent, nodes)
            assert wait_for(lambda: len(fake.objects("pods")) == 4)  # one evicted
            assert wait_for(lambda: len(fake.objects("events")) == 2)
            LedgerReconciler(replica.cache, replica.api).run_once()
        finally:
            replica.close()
        return needed(fake.requests)


def test_the_extenders_rbac_covers_scheduling_preemption_tenancy_and_dra_feeds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _extender_calls(monkeypatch)
    rules = grants(manifest("extender", "rbac.yaml"), "gpupool-extender")
    assert refused(calls, rules) == set()
    read = {(c.group, c.resource) for c in calls if c.verb in ("get", "list", "watch")}
    assert read >= {("", "nodes"), ("", "pods"), ("policy", "poddisruptionbudgets"),
                    ("gpupool.io", "tenantquotas"), ("gpupool.io", "gpupermissions"),
                    ("gpupool.io", "gpudevices"), ("gpupool.io", "gpuledgers"),
                    ("resource.k8s.io", "resourceslices"),
                    ("resource.k8s.io", "resourceclaims")}
    assert writes(calls) == {("", "pods/binding"), ("", "pods/eviction"), ("", "events"),
                             ("gpupool.io", "gpuledgers"), ("", "secrets"), ("", "configmaps")}


def test_the_extender_can_write_no_pod_claim_quota_permission_or_gpu() -> None:
    rules = grants(manifest("extender", "rbac.yaml"), "gpupool-extender")
    forbidden = [Call("", "pods", "patch", "team-a", "p"),
                 Call("", "pods", "delete", "team-a", "p"),
                 Call("", "secrets", "list", NS, ""),
                 Call("", "secrets", "get", "team-a", "token"),
                 Call("resource.k8s.io", "resourceclaims", "update", "team-a", "c"),
                 Call("resource.k8s.io", "resourceclaims/status", "patch", "team-a", "c"),
                 Call("resource.k8s.io", "resourceslices", "create", "", ""),
                 Call("gpupool.io", "tenantquotas", "update", "", "q"),
                 Call("gpupool.io", "gpupermissions", "patch", "", "p"),
                 Call("gpupool.io", "gpudevices", "update", "", "gpu-1"),
                 Call("", "namespaces", "patch", "", "team-a")]
    assert refused(forbidden, rules) == set(forbidden)


def test_the_controllers_rbac_with_its_dra_role_covers_tenancy_statuses_and_deviceclasses(
        ) -> None:
    with FakeApiServer() as fake:
        for obj in (device("n1", 0), device("n2", 0, "T4", 16 * GIB)):
            fake.seed("gpudevices", obj)
        fake.seed("nodes", {"metadata": {"name": "n1", "labels": {"zone": "a"}}})
        fake.seed("namespaces", {"metadata": {"name": "lab"}})
        fake.seed("resourcegroups", group("team", nodes=["n1"], quota={"gpus": 1}))
        fake.seed("tenantquotas", {"metadata": {"name": "lab", "generation": 1},
                                   "spec": {"namespaces": ["lab"], "limits": {"gpus": 2}}})
        fake.seed("gpupermissions", {"metadata": {"name": "lab-zone-a", "generation": 1},
                                     "spec": {"tenants": ["lab"], "nodeSelector": {
                                         "matchLabels": {"zone": "a"}}}})
        api, dra = ControllerApi.open(server=fake.url), DraApi.connect(server=fake.url)
        assert isinstance(dra, DraApi)
        try:
            out = Controller(api, verify=None,
                             device_classes=DeviceClassSync(dra)).reconcile_once()
            assert out.failures == [] and out.device_classes
        finally:
            api.close()
            dra.close()
        calls = needed(fake.requests)
    rules = grants(manifest("controller", "rbac.yaml"), "gpupool-controller") + \
        grants(manifest("dra", "rbac.yaml"), "gpupool-controller")
    assert refused(calls, rules) == set()
    read = {(c.group, c.resource) for c in calls if c.verb in ("get", "list", "watch")}
    assert read >= {("", "nodes"), ("", "namespaces"), ("gpupool.io", "tenantquotas"),
                    ("gpupool.io", "gpupermissions"), ("resource.k8s.io", "deviceclasses")}
    assert writes(calls) == {("gpupool.io", "resourceclasses"),
                             ("gpupool.io", "resourceclasses/status"),
                             ("gpupool.io", "resourcegroups/status"),
                             ("gpupool.io", "tenantquotas/status"),
                             ("gpupool.io", "gpupermissions/status"),
                             ("resource.k8s.io", "deviceclasses")}


def _node_agent_calls(fake: FakeApiServer, root: Path, published: str, *extra: str
                      ) -> set[Call]:
    """``gpupool device-plugin`` started on a node, run until it has published its GPUs
    (GPUDevices, or the node's ResourceSlice in DRA mode), then stopped with SIGTERM."""
    gpus = write_gpus(root / "gpus.yaml", 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "device-plugin", "--node-name", AGENT_NODE,
         "--api-server", fake.url, "--kubelet-dir", str(root / "kubelet"),
         "--fake-gpus", str(gpus), "--state-dir", str(root / "state"),
         "--isolation-provider", "none", "--metrics-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: fake.objects(published), 30)
        time.sleep(0.5)  # its informers list and watch
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return needed(fake.requests)


def test_the_node_agents_rbac_covers_its_start_and_its_gpu_and_slice_publishing() -> None:
    """Start-up and publishing only: the pod patches, evictions and Events that follow a
    workload are not run here (the ValidatingAdmissionPolicies scope those by node)."""
    rules = grants(manifest("node-agent", "rbac.yaml"), "gpupool-node-agent")
    root = Path(tempfile.mkdtemp(prefix="gp-", dir="/tmp"))  # unix socket paths stay short
    kubelet = FakeKubelet(root / "kubelet").start()
    try:
        with FakeApiServer() as fake:
            plugin = _node_agent_calls(fake, root, "gpudevices")
        with FakeApiServer() as fake:
            fake.seed("nodes", {"metadata": {"name": AGENT_NODE, "labels": {
                dra.NODE_MODE_LABEL: dra.MODE_DRA}}})
            dra_kubelet = FakeDraKubelet(root / "kubelet")
            try:
                in_dra = _node_agent_calls(fake, root, "resourceslices",
                                           "--cdi-dir", str(root / "cdi"))
            finally:
                dra_kubelet.close()
    finally:
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert refused(plugin | in_dra, rules) == set()
    assert ("gpupool.io", "gpudevices") in writes(plugin)
    assert ("resource.k8s.io", "resourceslices") in writes(in_dra)
    assert writes(plugin | in_dra) <= {("gpupool.io", "gpudevices"),
                                       ("gpupool.io", "gpudevices/status"),
                                       ("resource.k8s.io", "resourceslices"),
                                       ("", "pods"), ("", "events")}
