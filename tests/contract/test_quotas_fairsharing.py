"""TenantQuota ``spec.fairSharing``: read into the core value, refused when not a boolean,
and the tenant book's fair-share arithmetic over the members' waiting pods."""

from __future__ import annotations

from typing import Any

from gpupool.contract.quotas import Broken, quota_of
from gpupool.core.quota import Amount, Charge, Limit, QuotaBook
from gpupool.core.tenants import TenantBook, TenantQuota


def obj(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def test_fair_sharing_is_read_and_defaults_to_off() -> None:
    on = quota_of(obj("b", namespaces=["b"], cohort="lab", fairSharing=True))
    off = quota_of(obj("c", namespaces=["c"], cohort="lab"))
    assert isinstance(on, TenantQuota) and on.fair_sharing
    assert isinstance(off, TenantQuota) and not off.fair_sharing


def test_a_fair_sharing_that_is_no_boolean_is_refused_naming_the_field() -> None:
    found = quota_of(obj("b", namespaces=["b"], cohort="lab", fairSharing="yes"))
    assert isinstance(found, Broken)
    assert "spec.fairSharing must be true or false, got 'yes'" in found.message


def book(fair: bool) -> TenantBook:
    return TenantBook([TenantQuota("a", frozenset({"a"}), Limit(4), cohort="lab"),
                       TenantQuota("b", frozenset({"b"}), Limit(0), cohort="lab",
                                   fair_sharing=fair),
                       TenantQuota("c", frozenset({"c"}), Limit(0), cohort="lab", weight=3)])


def test_one_member_asking_makes_the_whole_cohort_share_fairly() -> None:
    assert book(True).shares_fairly("lab")
    assert not book(False).shares_fairly("lab")


def test_a_borrow_beyond_the_weighted_share_is_refused_while_others_wait() -> None:
    tenants, quotas = book(True), QuotaBook()
    quotas.charge("b0", Charge(Amount(1), "b"))
    for k in range(3):
        assert tenants.check(quotas, Charge(Amount(1), "c"), f"c{k}") is None  # noted
    refused = tenants.check(quotas, Charge(Amount(1), "b"), "b1")
    assert refused is not None and not refused.permanent
    assert refused.message == ("fair share of tenant b in cohort lab reached: 1 GPUs asked, "
                               "1 of 1 borrowed (weight 1 of 4), wait or raise the weight")
    for k in range(3):  # team-c's pods were placed: they no longer wait
        quotas.charge(f"c{k}", Charge(Amount(1), "c"))
    assert "cannot borrow" in tenants.check(quotas, Charge(Amount(1), "b"), "b1").message


def test_a_pod_checked_again_is_counted_once() -> None:
    tenants, quotas = book(True), QuotaBook()
    for _ in range(5):
        tenants.check(quotas, Charge(Amount(1), "c"), "c0")
    assert tenants.waiting_by_member(quotas, "lab")["tenant c"] == Amount(1)
