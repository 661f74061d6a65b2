"""PodDisruptionBudgets as preemption reads them: which budgets cover a pod, and how many
more pods each lets go.

A budget (policy/v1) covers the pods of its namespace its ``spec.selector`` matches (an
empty selector matches every pod of the namespace; none matches no pod), and
``status.disruptionsAllowed`` is how many more of them the Eviction API lets go now
(the disruption controller keeps it current). Preemption chooses victim sets within
those counts (``core.victims``), and evicts through the Eviction API, which refuses
(HTTP 429) what a budget does not allow whatever was chosen. A budget whose selector
cannot be read covers every pod of its namespace (the safe side).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.core.model import Labels
from gpupool.core.selector import Selector

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Budget:
    """One PodDisruptionBudget: ``name`` is namespace/name; ``selector`` None matches no
    pod, ``every`` matches every pod of the namespace."""

    name: str
    namespace: str
    selector: Selector | None
    allowed: int
    every: bool = False

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if namespace != self.namespace:
            return False
        return self.every or (self.selector is not None and self.selector.matches(labels))


def budget_of(obj: Mapping[str, Any]) -> Budget:
    """A budget from a PodDisruptionBudget object; ``InvalidInput`` names what is wrong."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = obj.get("status") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    if not name or not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise InvalidInput(f"PodDisruptionBudget {ns}/{name or '?'} is not readable")
    allowed = status.get("disruptionsAllowed", 0)
    allowed = allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0
    raw = spec.get("selector")
    if raw is None:
        return Budget(f"{ns}/{name}", ns, None, allowed)
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"PodDisruptionBudget {ns}/{name}: spec.selector is not an object")
    if not raw.get("matchLabels") and not raw.get("matchExpressions"):
        return Budget(f"{ns}/{name}", ns, None, allowed, every=True)
    try:
        return Budget(f"{ns}/{name}", ns, Selector.from_spec(raw), allowed)
    except InvalidInput as exc:
        log.warning("PodDisruptionBudget %s/%s covers its whole namespace: %s", ns, name, exc)
        return Budget(f"{ns}/{name}", ns, None, allowed, every=True)


class Budgets:
    """The cluster's budgets by name (use under the cache lock)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Budget] = {}

    def sync(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.by_name = {}
        for obj in objs:
            self.event("ADDED", obj)

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        if kind == "DELETED":
            self.by_name.pop(name, None)
            return
        try:
            self.by_name[name] = budget_of(obj)
        except InvalidInput as exc:
            log.warning("%s", exc)

    def covering(self, namespace: str, labels: Labels) -> tuple[str, ...]:
        """Names of the budgets that cover a pod of ``namespace`` with ``labels``."""
        mapping = dict(labels)
        return tuple(sorted(b.name for b in self.by_name.values()
                            if b.covers(namespace, mapping)))

    def allowed(self) -> dict[str, int]:
        return {name: b.allowed for name, b in self.by_name.items()}
