"""TenantQuota and GPUPermission objects -> core values, or a reason naming the field; and
the tenant book's arithmetic over namespaces and cohorts."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.contract.quotas import Broken, permission_of, permission_or_denial, quota_of
from gpupool.core.model import Node, uniform_node
from gpupool.core.quota import Amount, Charge, Limit, QuotaBook
from gpupool.core.tenants import TenantBook, TenantQuota


def make_node(name: str, gpus: int, labels: dict[str, str] | None = None) -> Node:
    return uniform_node(name, 8000, 65536, gpus, "A100", 40960, labels)


def obj(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def test_a_full_tenant_quota_is_read_into_the_core_value() -> None:
    q = quota_of(obj("team-a", namespaces=["a", "a-dev"], limits={"gpus": 8, "corePct": 400},
                     classes={"t4": {"gpus": 2}}, cohort="research",
                     borrowingLimit={"gpus": 4}, lendingLimit={"gpus": 2}, weight=3))
    assert q == TenantQuota("team-a", frozenset({"a", "a-dev"}), Limit(8, None, 400),
                            (("t4", Limit(2)),), "research", Limit(4), Limit(2), 3)


@pytest.mark.parametrize(("spec", "words"), [
    ({"namespaces": "a"}, "spec.namespaces must be a list of namespace names"),
    ({"namespaces": ["Team_A"]}, "spec.namespaces[0] 'Team_A' is not a namespace name"),
    ({"limits": {"gpu": 1}}, "spec.limits has unknown keys gpu (known: gpus, memoryMiB"),
    ({"limits": {"gpus": -1}}, "spec.limits.gpus must be a whole number >= 0, got -1"),
    ({"limits": {"gpus": "8"}}, "spec.limits.gpus must be a whole number >= 0, got '8'"),
    ({"classes": {"t4": {"gpus": True}}}, "spec.classes.t4.gpus must be a whole number"),
    ({"classes": ["t4"]}, "spec.classes must be a map of class name -> limits"),
    ({"cohort": "Research Lab"}, "spec.cohort 'Research Lab' must be 1-63 lower-case"),
    ({"weight": 1.5}, "spec.weight must be a whole number from 0 to 1000000, got 1.5"),
    ({"nominal": {"gpus": 1}}, "spec has unknown fields nominal (known: namespaces"),
])
def test_a_broken_tenant_quota_gets_a_reason_naming_the_field(spec: dict[str, Any],
                                                              words: str) -> None:
    found = quota_of({"metadata": {"name": "q"}, "spec": spec})
    assert isinstance(found, Broken) and found.reason == "InvalidSpec"
    assert found.message.startswith("TenantQuota q: ") and words in found.message


def test_a_spec_that_is_no_object_is_broken_not_a_crash() -> None:
    assert isinstance(quota_of({"metadata": {"name": "q"}, "spec": [1]}), Broken)
    assert isinstance(permission_of({"metadata": "x", "spec": "y"}), Broken)


def test_a_broken_permission_with_readable_tenants_permits_them_nothing() -> None:
    bad = obj("p", tenants=["lab"], gpuSelector={"matchExpressions": [{"key": "k"}]})
    assert isinstance(permission_of(bad), Broken)
    denial = permission_or_denial(bad)
    assert not isinstance(denial, Broken) and denial.broken
    node = make_node("n", gpus=1)
    assert not denial.permits(node, node.gpus[0])
    assert isinstance(permission_or_denial(obj("p", tenants="lab")), Broken)


def test_a_permission_matches_node_labels_and_gpu_labels() -> None:
    p = permission_of(obj("zone-a", tenants=["lab"], nodeSelector={"matchLabels": {"z": "a"}},
                          gpuSelector={"matchLabels": {"gpupool.io/model": "A100"}}))
    assert not isinstance(p, Broken)
    a = make_node("a", gpus=1, labels={"z": "a"})
    b = make_node("b", gpus=1, labels={"z": "b"})
    assert p.permits(a, a.gpus[0]) and not p.permits(b, b.gpus[0])


def charged(book: QuotaBook, key: str, ns: str, gpus: int, gpu_class: str | None = None
            ) -> None:
    book.charge(key, Charge(Amount(gpus, 0, 100 * gpus), ns, gpu_class))


def test_a_tenant_adds_up_its_namespaces_and_other_namespaces_do_not_count() -> None:
    book, tenants = QuotaBook(), TenantBook([TenantQuota("t", frozenset({"a", "b"}), Limit(3))])
    charged(book, "1", "a", 1)
    charged(book, "2", "b", 1)
    charged(book, "3", "c", 5)
    reason = tenants.check(book, Charge(Amount(2), "a"))
    assert reason is not None and reason.message == (
        "quota of tenant t exceeded: 2 GPUs asked, 2 of 3 in use, 1 left")
    assert tenants.check(book, Charge(Amount(1), "b")) is None
    assert tenants.check(book, Charge(Amount(9), "c")) is None


def test_two_tenants_claiming_one_namespace_both_apply_and_are_reported() -> None:
    tenants = TenantBook([TenantQuota("x", frozenset({"a"}), Limit(5)),
                          TenantQuota("y", frozenset({"a"}), Limit(1))])
    assert tenants.overlaps() == {"a": ("x", "y")}
    reason = tenants.check(QuotaBook(), Charge(Amount(2), "a"))
    assert reason is not None and "tenant y" in reason.message and reason.permanent


def test_in_a_cohort_a_tenant_borrows_what_a_peer_does_not_use_and_no_more() -> None:
    book = QuotaBook()
    tenants = TenantBook([TenantQuota("a", frozenset({"a"}), Limit(2), cohort="lab"),
                          TenantQuota("b", frozenset({"b"}), Limit(2), cohort="lab")])
    charged(book, "1", "a", 2)
    assert tenants.check(book, Charge(Amount(2), "a")) is None  # b's 2 idle GPUs
    charged(book, "2", "a", 2)
    reason = tenants.check(book, Charge(Amount(1), "a"))
    assert reason is not None and "cohort lab" in reason.message and not reason.permanent
    back = tenants.check(book, Charge(Amount(1), "b"))  # b's own nominal, lent out
    assert back is not None and "must be reclaimed" in back.message and not back.permanent
