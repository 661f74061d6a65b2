"""The extender's shipped RBAC allows every call it makes (start with its keys and
certificates, rebuild, bind, preemption, ledger reconciliation, renewal) and it writes only
Bindings, Evictions, Events, GPULedgers and its own Secrets and ConfigMap — never a pod."""

from __future__ import annotations

import time

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.bind.reconcile import LedgerReconciler
from gpupool.extender.edge.tls import SERVING_SECRET, TlsSource
from tests.rbac_grants import grants, manifest, needed, refused, writes
from tests.waiting import wait_for

from .builders import NAMESPACE, Replica, pod_obj, schedule, seed_cluster


def test_the_extenders_rbac_covers_what_it_does_and_it_never_writes_a_pod() -> None:
    with FakeApiServer() as fake:
        nodes = seed_cluster(fake, 2, 2)
        replica = Replica(fake)  # keys made and published, caches listed and watching
        try:
            source = TlsSource(NAMESPACE)
            source.material(replica.api, time.time())  # CA, serving and client certificates
            fake.delete("secrets", SERVING_SECRET, NAMESPACE)
            source.material(replica.api, time.time())  # renewal
            replica.keys.reload()
            for k in range(4):
                pod = fake.seed("pods", pod_obj(f"p{k}", {"gpupool.io/gpu": "1"}))
                assert schedule(replica.extender, pod, nodes)[1] == ""
            urgent = pod_obj("urgent", {"gpupool.io/gpu": "1"})
            urgent["spec"]["priority"] = 1000
            urgent = fake.seed("pods", urgent)
            assert wait_for(lambda: "budgets" in replica.cache.synced)
            schedule(replica.extender, urgent, nodes)  # preempts: eviction, Events, a hold
            assert wait_for(lambda: len(fake.objects("pods")) == 4)  # one of p0..p3 evicted
            assert wait_for(lambda: len(fake.objects("events")) == 2)
            LedgerReconciler(replica.cache, replica.api).run_once()
        finally:
            replica.close()
        calls = needed(fake.requests)
    rules = grants(manifest("extender", "rbac.yaml"), "gpupool-extender")
    assert refused(calls, rules) == set()
    assert writes(calls) == {("", "pods/binding"), ("gpupool.io", "gpuledgers"),
                             ("", "secrets"), ("", "configmaps"), ("", "pods/eviction"),
                             ("", "events")}
