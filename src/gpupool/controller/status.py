"""Status vocabulary: Kubernetes-style conditions, quota amounts, and merge-patch diffs.

Conditions follow ``metav1.Condition``: ``type``, ``status`` (``"True"`` /
``"False"``), a CamelCase ``reason``, a ``message`` a person can act on, and
``lastTransitionTime``, which moves only when ``status`` changes — so writing
the same verdict twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.core.quota import Amount, Limit

MAX_LISTED = 10
"""At most this many pods are named in a status list (the count says the rest)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One condition's outcome before it is stamped with a transition time."""

    type: str
    ok: bool
    reason: str
    message: str


def condition(verdict: Verdict, previous: Sequence[Mapping[str, Any]] | None, now: str,
              generation: int | None = None) -> dict[str, Any]:
    """The condition for ``verdict``; keeps the old transition time if status is unchanged."""
    status = "True" if verdict.ok else "False"
    old = next((c for c in previous or () if isinstance(c, Mapping)
                and c.get("type") == verdict.type), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    out: dict[str, Any] = {"type": verdict.type, "status": status, "reason": verdict.reason,
                           "message": verdict.message,
                           "lastTransitionTime": since or now}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def conditions(verdicts: Sequence[Verdict], status: Mapping[str, Any] | None, now: str,
               generation: int | None) -> list[dict[str, Any]]:
    previous = (status or {}).get("conditions")
    prev = previous if isinstance(previous, list) else []
    return [condition(v, prev, now, generation) for v in verdicts]


def amount_json(amount: Amount) -> dict[str, int]:
    return {"gpus": amount.gpus, "memoryMiB": amount.memory_mib, "corePct": amount.core_pct}


def limit_json(limit: Limit) -> dict[str, int]:
    """Only the limited dimensions (an unlimited one is absent)."""
    dims = {"gpus": limit.gpus, "memoryMiB": limit.memory_mib, "corePct": limit.core_pct}
    return {k: v for k, v in dims.items() if v is not None}


def merge_diff(current: Any, desired: Any) -> Any:
    """The RFC 7386 merge patch that turns ``current`` into ``desired`` (``{}``: equal).

    Maps are diffed key by key (a key absent from ``desired`` becomes ``None``,
    i.e. deleted); anything else, lists included, is replaced whole.
    """
    if not isinstance(current, Mapping) or not isinstance(desired, Mapping):
        return {} if current == desired else desired
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        have = current.get(key)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            sub = merge_diff(have, want)
            if sub:
                patch[key] = sub
        elif have != want or key not in current:
            patch[key] = want
    for key in current:
        if key not in desired:
            patch[key] = None
    return patch
