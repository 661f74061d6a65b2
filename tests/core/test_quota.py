"""Quota arithmetic: limits, idempotent charges and refunds, reasons with numbers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput
from gpupool.core.quota import (
    Amount,
    Charge,
    Limit,
    QuotaBook,
    amount_of_allocation,
    amount_of_request,
)
from gpupool.core.reasons import Check
from gpupool.core.request import Affinity, PodRequest

from .builders import pod, shared, whole

A100 = 40960


def test_amounts_add_and_subtract_per_dimension() -> None:
    assert Amount(1, 100, 10) + Amount(2, 50, 90) == Amount(3, 150, 100)
    assert Amount(3, 150, 100).minus(Amount(1, 100, 10)) == Amount(2, 50, 90)
    with pytest.raises(InvalidInput, match="cannot be negative"):
        Amount(1, 0, 0).minus(Amount(2, 0, 0))


@pytest.mark.parametrize("limit", [{"gpus": -1}, {"memory_mib": -5}, {"core_pct": -1}])
def test_a_negative_limit_is_refused(limit: dict[str, int]) -> None:
    with pytest.raises(InvalidInput, match="must be >= 0"):
        Limit(**limit)


@pytest.mark.parametrize(("limit", "used", "remaining"), [
    (Limit(gpus=4), Amount(1, 2048, 100), Limit(gpus=3)),
    (Limit(4, 8192, 200), Amount(1, 2048, 100), Limit(3, 6144, 100)),
    (Limit(gpus=2), Amount(5, 0, 0), Limit(gpus=0)),
    (Limit(), Amount(9, 9, 9), Limit()),
], ids=["GPUs only", "every dimension", "over-used stays at 0", "unlimited"])
def test_remaining_is_limit_minus_used(limit: Limit, used: Amount, remaining: Limit) -> None:
    assert limit.remaining(used) == remaining


def _alloc(key: str, *slices: tuple[str, int, int]) -> Allocation:
    return Allocation(key, "n", 0, 0, tuple(Slice(u, i, m, c) for i, (u, m, c) in
                                            enumerate(slices)))


@pytest.mark.parametrize(("alloc", "amount"), [
    (_alloc("a", ("g0", A100, 100), ("g1", A100, 100)), Amount(2, 2 * A100, 200)),
    (_alloc("a", ("g0", 4096, 30)), Amount(1, 4096, 30)),
    (_alloc("a", ("g0", 1024, 10), ("g0", 2048, 20)), Amount(1, 3072, 30)),
    (_alloc("a"), Amount()),
], ids=["two whole GPUs", "one slice", "two containers on one GPU count it once", "CPU only"])
def test_an_allocation_counts_distinct_gpus_and_summed_slices(alloc: Allocation,
                                                              amount: Amount) -> None:
    assert amount_of_allocation(alloc) == amount


@pytest.mark.parametrize(("request_", "amount"), [
    (pod("p", whole(2)), Amount(2, 2 * A100, 200)),
    (pod("p", shared(2, 1000, 30)), Amount(2, 2 * 1024, 60)),
    (pod("p", shared(1, 0, 50)), Amount(1, 0, 50)),
    (pod("p", shared(1, 512, 10), shared(1, 256, 20), affinity=Affinity.POD),
     Amount(1, 768, 30)),
    (pod("p"), Amount()),
], ids=["exclusive counts whole GPUs", "shared memory is rounded up to units",
        "compute only", "pod affinity sums the containers on one GPU", "no GPU"])
def test_a_request_is_counted_as_it_will_be_held(request_: PodRequest, amount: Amount) -> None:
    assert amount_of_request(request_, 256, A100) == amount


def test_charging_and_refunding_are_idempotent_per_allocation_key() -> None:
    book = QuotaBook()
    c = Charge(Amount(1, 1024, 10), "t", "a100", "g")
    book.charge("k", c)
    book.charge("k", c)
    assert book.used_by_tenant("t") == Amount(1, 1024, 10)
    assert book.used_by_class("t", "a100") == Amount(1, 1024, 10)
    assert book.used_by_group("g") == Amount(1, 1024, 10)
    assert book.refund("k") == c and book.refund("k") is None
    assert (book.used_by_tenant("t"), book.used_by_group("g"), len(book)) == (Amount(), Amount(), 0)


def test_a_different_charge_under_a_held_key_is_refused_and_changes_nothing() -> None:
    book = QuotaBook()
    book.charge("k", Charge(Amount(1, 0, 10), "t"))
    with pytest.raises(InvalidInput, match="already charged"):
        book.charge("k", Charge(Amount(2, 0, 10), "t"))
    assert book.used_by_tenant("t") == Amount(1, 0, 10)


def test_refunds_restore_exactly_whatever_the_order() -> None:
    book = QuotaBook()
    charges = {f"k{i}": Charge(Amount(i, 100 * i, 10 * i), "t", "c" if i % 2 else None)
               for i in range(1, 6)}
    for k, c in charges.items():
        book.charge(k, c)
    assert book.used_by_tenant("t") == Amount(15, 1500, 150)
    assert book.used_by_class("t", "c") == Amount(9, 900, 90)
    for k in ["k3", "k1", "k5", "k2", "k4"]:
        book.refund(k)
    assert book.used_by_tenant("t") == Amount() and book.used_by_class("t", "c") == Amount()


def _book() -> QuotaBook:
    book = QuotaBook()
    book.set_tenant_limit("t", Limit(gpus=4, memory_mib=8192))
    book.set_class_limit("t", "a100", Limit(gpus=2))
    book.set_group_limit("g", Limit(core_pct=150))
    book.charge("old", Charge(Amount(1, 4096, 100), "t", "a100", "g"))
    return book


@pytest.mark.parametrize(("charge", "message", "permanent"), [
    (Charge(Amount(4, 0, 0), "t"), "quota of tenant t exceeded: 4 GPUs asked, 1 of 4 in use, "
     "3 left", False),
    (Charge(Amount(1, 5000, 0), "t"), "quota of tenant t exceeded: 5000 MiB of GPU memory "
     "asked, 4096 of 8192 in use, 4096 left", False),
    (Charge(Amount(2, 0, 0), "t", "a100"), "quota of tenant t for class a100 exceeded: 2 GPUs "
     "asked, 1 of 2 in use, 1 left", False),
    (Charge(Amount(1, 0, 60), group="g"), "quota of group g exceeded: 60 % of GPU compute "
     "asked, 100 of 150 in use, 50 left", False),
    (Charge(Amount(5, 0, 0), "t"), "quota of tenant t exceeded: 5 GPUs asked, 1 of 4 in use",
     True),
], ids=["tenant GPUs", "tenant GPU memory", "tenant per class", "group compute",
        "more than the whole limit can never fit"])
def test_an_exceeded_limit_is_a_quota_reason_with_numbers(charge: Charge, message: str,
                                                          permanent: bool) -> None:
    reason = _book().check(charge)
    assert reason is not None and reason.check is Check.QUOTA
    assert message in reason.message and reason.permanent is permanent


@pytest.mark.parametrize("charge", [
    Charge(Amount(3, 4096, 0), "t"),
    Charge(Amount(1, 0, 0), "t", "a100"),
    Charge(Amount(9, 99999, 999), "other"),
    Charge(Amount(9, 99999, 999), None, "a100"),
    Charge(Amount(1, 0, 50), group="g"),
    Charge(Amount(), "t", "a100", "g"),
], ids=["exactly up to the tenant limit", "last GPU of the class", "unlimited tenant",
        "no tenant: only group limits apply", "exactly up to the group limit", "nothing asked"])
def test_a_charge_within_every_limit_passes(charge: Charge) -> None:
    assert _book().check(charge) is None


def test_lifting_a_limit_lets_the_charge_through() -> None:
    book = _book()
    assert book.check(Charge(Amount(5), "t")) is not None
    book.set_tenant_limit("t", None)
    assert book.check(Charge(Amount(5), "t")) is None
    assert book.remaining_for_group("g") == Limit(core_pct=50)
    assert book.remaining_for_group("nolimit") == Limit()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["k1", "k2", "k3", "k4"]),
                          st.integers(0, 4), st.sampled_from(["t", "u"]),
                          st.sampled_from([None, "c"]), st.sampled_from([None, "g"])),
                max_size=40))
def test_used_is_always_the_sum_of_the_charges_held(
        ops: list[tuple[bool, str, int, str, str | None, str | None]]) -> None:
    book = QuotaBook()
    for charge_it, key, gpus, tenant, cls, group in ops:
        if charge_it and book.charged(key) is None:
            book.charge(key, Charge(Amount(gpus, gpus * 1024, gpus * 100), tenant, cls, group))
        elif not charge_it:
            book.refund(key)
    held = [c for k in ("k1", "k2", "k3", "k4") if (c := book.charged(k)) is not None]
    for tenant in ("t", "u"):
        expected = sum((c.amount for c in held if c.tenant == tenant), Amount())
        assert book.used_by_tenant(tenant) == expected
        expected = sum((c.amount for c in held if c.tenant == tenant and c.gpu_class == "c"),
                       Amount())
        assert book.used_by_class(tenant, "c") == expected
    assert book.used_by_group("g") == sum((c.amount for c in held if c.group == "g"), Amount())
