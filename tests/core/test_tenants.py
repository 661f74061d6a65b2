"""The tenant book's shortcut never admits what the cohort arithmetic would not (property),
and tenant quotas in a cohort answer as ``core.cohort.admit`` does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.quota import Amount, Charge, Limit, QuotaBook
from gpupool.core.tenants import TenantBook, TenantQuota

small = st.integers(0, 6)
maybe = st.one_of(st.none(), small)


@st.composite
def cohorts(draw: st.DrawFn) -> tuple[TenantBook, QuotaBook, Amount]:
    quotas, book = [], QuotaBook()
    for t in range(draw(st.integers(1, 4))):
        quotas.append(TenantQuota(f"t{t}", frozenset({f"ns{t}"}),
                                  Limit(draw(small), draw(maybe), None),
                                  cohort=draw(st.sampled_from(["c", "c", None])),
                                  borrowing_limit=draw(st.one_of(
                                      st.none(), st.builds(Limit, maybe, maybe))),
                                  lending_limit=draw(st.one_of(
                                      st.none(), st.builds(Limit, maybe, maybe)))))
        for k in range(draw(st.integers(0, 3))):
            book.charge(f"{t}-{k}", Charge(Amount(draw(small), draw(small), 0), f"ns{t}"))
    return TenantBook(quotas), book, Amount(draw(small), draw(small), 0)


@settings(max_examples=300, deadline=None)
@given(cohorts())
def test_the_shortcut_admits_only_what_the_cohort_arithmetic_admits(
        case: tuple[TenantBook, QuotaBook, Amount]) -> None:
    tenants, book, amount = case
    for more in range(3):  # the shortcut remembers sums: a charge must not leave them stale
        for q in tenants:
            if q.cohort is not None and tenants._surely_fits(book, q, amount):
                assert tenants.admission(book, q, amount).admitted
        book.charge(f"more-{more}", Charge(Amount(2, 1, 0), "ns0"))


@settings(max_examples=300, deadline=None)
@given(cohorts())
def test_a_tenant_in_a_cohort_is_refused_exactly_when_the_arithmetic_does_not_admit(
        case: tuple[TenantBook, QuotaBook, Amount]) -> None:
    tenants, book, amount = case
    for q in tenants:
        if q.cohort is None:
            continue
        refused = tenants.check(book, Charge(amount, next(iter(q.namespaces))))
        covering = tenants.covering(next(iter(q.namespaces)))
        if covering == (q,):
            assert (refused is None) == tenants.admission(book, q, amount).admitted
