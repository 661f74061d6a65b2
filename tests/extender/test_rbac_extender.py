"""The extender's shipped RBAC allows every call it makes (start with its keys and
certificates, rebuild, bind, ledger reconciliation, renewal) and it writes only
Bindings, GPULedgers and its own Secrets and ConfigMap — never a pod."""

from __future__ import annotations

import time

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.reconcile import LedgerReconciler
from gpupool.extender.tls import SERVING_SECRET, TlsSource
from tests.rbac_grants import grants, manifest, needed, refused, writes

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
            for k in range(3):
                pod = fake.seed("pods", pod_obj(f"p{k}", {"gpupool.io/gpu": "1"}))
                assert schedule(replica.extender, pod, nodes)[1] == ""
            fake.delete("pods", "p0", "default")
            LedgerReconciler(replica.cache, replica.api).run_once()
        finally:
            replica.close()
        calls = needed(fake.requests)
    rules = grants(manifest("extender", "rbac.yaml"), "gpupool-extender")
    assert refused(calls, rules) == set()
    assert writes(calls) == {("", "pods/binding"), ("gpupool.io", "gpuledgers"),
                             ("", "secrets"), ("", "configmaps")}
