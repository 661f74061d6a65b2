"""Review of fair share's waiting asks: one namespace flooding the cluster with pending
pods must not push the other members' waiting asks out of what fair share counts."""

from __future__ import annotations

from gpupool.core.quota import Amount
from gpupool.core.tenantshare import MAX_WAITING, WaitingAsks


def test_a_namespace_flooding_waiting_asks_drops_its_own_asks_not_another_tenants() -> None:
    asks = WaitingAsks()
    asks.note("victim-pod", "victim", Amount(gpus=4))
    for k in range(MAX_WAITING + 50):
        asks.note(f"flood-{k}", "hostile", Amount(gpus=1))
    waiting = asks.by_namespace()
    assert waiting["victim"] == Amount(gpus=4)
    assert waiting["hostile"] == Amount(gpus=MAX_WAITING - 1)
    assert asks.total == Amount(gpus=MAX_WAITING + 3)
