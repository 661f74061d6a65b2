"""Fair shares: whole units of one resource divided among claimants by weight.

Weighted max-min fairness (water filling): nobody gets more than it wants, and what one
does not want goes to the others in proportion to their weights. In whole units the real
water level is worked out first, and the few units its floors leave are handed out one at
a time to the lowest ``(share + 1) / weight`` — the d'Hondt (Jefferson) divisor rule, which
never gives a claimant less when its weight grows. Pure and exact (``Fraction``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from fractions import Fraction
from math import floor


def weighted_max_min(capacity: int, wants: Mapping[str, int],
                     weights: Mapping[str, float]) -> dict[str, int]:
    """Divide ``capacity`` whole units among ``wants`` by weight: nobody gets more than it
    wants, and what one does not want goes to the others in proportion to their weights
    (members of weight 0 share, equally, only what the others leave). Deterministic: ties
    go by name."""
    live = {g: w for g, w in wants.items() if w > 0}
    weighted = {g for g in live if weights.get(g, 1) > 0}
    first = _dhondt(capacity, {g: live[g] for g in weighted},
                    {g: Fraction(weights.get(g, 1)) for g in weighted})
    rest = capacity - sum(first.values())
    second = _dhondt(rest, {g: live[g] for g in live if g not in weighted},
                     {g: Fraction(1) for g in live if g not in weighted})
    return {g: first.get(g, 0) + second.get(g, 0) for g in wants}


def _dhondt(capacity: int, wants: Mapping[str, int], weights: Mapping[str, Fraction]
            ) -> dict[str, int]:
    """Unit by unit to the lowest ``(share + 1) / weight`` (ties: name): the real water
    level first, then the few units the floors leave, one at a time."""
    level = _water_level(capacity, wants, weights)
    share = {g: wants[g] if level is None else min(wants[g], floor(weights[g] * level))
             for g in wants}
    left = max(capacity - sum(share.values()), 0)
    heap = [((share[g] + 1) / weights[g], g) for g in sorted(wants) if share[g] < wants[g]]
    heapq.heapify(heap)
    while left and heap:
        _, g = heapq.heappop(heap)
        share[g] += 1
        left -= 1
        if share[g] < wants[g]:
            heapq.heappush(heap, ((share[g] + 1) / weights[g], g))
    return share


def _water_level(capacity: int, wants: Mapping[str, int], weights: Mapping[str, Fraction]
                 ) -> Fraction | None:
    """The level ``L`` at which ``sum(min(want, weight × L)) = capacity`` (None: every want
    fits)."""
    left, weight = Fraction(capacity), sum(weights.values(), Fraction(0))
    for g in sorted(wants, key=lambda g: (wants[g] / weights[g], g)):
        if wants[g] * weight <= left * weights[g]:
            left -= wants[g]
            weight -= weights[g]
        else:
            return left / weight
    return None
