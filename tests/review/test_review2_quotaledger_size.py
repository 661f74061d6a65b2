"""Review of the QuotaLedger's size: a scope (a whole cohort, a whole namespace) holds every
live pod's charge, so each object it is stored in must stay under what the API server
stores in one object, for a scope of a size the docs promise to handle. The entries are
written as binds write them (a compare-and-swap on the scope's head, a few binds' entries
at once, which moves its entries to shards when full) against the fake API server, then
read back as admission reads them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.state.ledger import Entry
from gpupool.extender.tenancy.quotaledger import QuotaLedgers
from gpupool.kube.api import KubeApi

ETCD_REQUEST_LIMIT_BYTES = 1_572_864  # etcd's default --max-request-bytes (1.5 MiB)
BATCH = 10
"""Binds that queue for the scope's turn are written as one (``state.turns``): 500 writes."""


def one_gpu_entry(k: int) -> tuple[str, Entry]:
    gpu, uid = f"GPU-{uuid.UUID(int=k)}", str(uuid.UUID(int=k + 1))
    alloc = Allocation(uid, f"gpu-node-{k // 8:04d}", 1000, 1024,
                       (Slice(gpu, k % 8, 81920, 100, "trainer"),), exclusive=True)
    entry = Entry(alloc, f"team-{k % 20:02d}/trainer-7f9c6d5b8-{k:05d}",
                  "2026-11-24T02:54:35.046329Z", f"team-{k % 20:02d}")
    return uid, entry


@pytest.fixture
def api() -> Iterator[tuple[FakeApiServer, KubeApi]]:
    with FakeApiServer() as fake:
        client = KubeApi.connect(server=fake.url)
        try:
            yield fake, client
        finally:
            client.close()


def test_the_quota_ledger_of_a_cohort_of_20_teams_running_5000_one_gpu_pods_fits_its_objects(
        api: tuple[FakeApiServer, KubeApi]) -> None:
    fake, client = api
    writer = QuotaLedgers(client)
    everything = dict(one_gpu_entry(k) for k in range(5000))
    uids = list(everything)
    for at in range(0, len(uids), BATCH):  # as a burst of 5000 binds writes them
        head = writer.known("cohort.research")
        batch = {uid: everything[uid] for uid in uids[at:at + BATCH]}
        writer.spread(writer.commit_all(head, "cohort research", batch), "cohort research")
    stored = fake.objects("quotaledgers")
    assert len(stored) > 1
    for obj in stored:
        assert len(json.dumps(obj)) < ETCD_REQUEST_LIMIT_BYTES, obj["metadata"]["name"]
    reader = QuotaLedgers(client)  # another replica, reading the scope for admission
    whole = reader.whole(*reader.state("cohort.research"))
    assert dict(whole.entries) == everything
