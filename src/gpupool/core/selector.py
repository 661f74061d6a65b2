"""Label selectors over GPU labels: matchLabels and matchExpressions.

Operators: In, NotIn, Exists, DoesNotExist, Gt, Lt. ``Gt``/``Lt`` compare
Kubernetes quantities exactly (``memory Gt 10Gi``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.quantity import parse_quantity


class Operator(Enum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpression; ``values`` are strings as users write them."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.key:
            raise InvalidInput("selector requirement has an empty key")
        op = self.operator
        if op in (Operator.IN, Operator.NOT_IN) and not self.values:
            raise InvalidInput(f"selector {self.key} {op.value} needs at least one value")
        if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and self.values:
            raise InvalidInput(f"selector {self.key} {op.value} takes no values")
        if op in (Operator.GT, Operator.LT):
            if len(self.values) != 1:
                raise InvalidInput(f"selector {self.key} {op.value} needs exactly one value")
            parse_quantity(self.values[0])

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        op = self.operator
        if op is Operator.EXISTS:
            return present
        if op is Operator.DOES_NOT_EXIST:
            return not present
        if op is Operator.IN:
            return present and labels[self.key] in self.values
        if op is Operator.NOT_IN:
            return not present or labels[self.key] not in self.values
        if not present:
            return False
        actual = _quantity_or_none(labels[self.key])
        if actual is None:
            return False
        bound = parse_quantity(self.values[0])
        return actual > bound if op is Operator.GT else actual < bound

    def describe(self) -> str:
        if self.operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
            return f"{self.key} {self.operator.value}"
        return f"{self.key} {self.operator.value} {','.join(self.values)}"


def _quantity_or_none(text: str) -> Fraction | None:
    try:
        return parse_quantity(text)
    except QuantityError:
        return None


@dataclass(frozen=True, slots=True)
class Selector:
    """matchLabels AND every matchExpression; the empty selector matches everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        return all(req.matches(labels) for req in self.expressions)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.match_labels]
        parts += [req.describe() for req in self.expressions]
        return ", ".join(parts) or "(everything)"

    @staticmethod
    def from_spec(spec: Mapping[str, object]) -> Selector:
        """Build from the Kubernetes ``LabelSelector`` shape (already-decoded data)."""
        labels = spec.get("matchLabels") or {}
        exprs = spec.get("matchExpressions") or []
        if not isinstance(labels, Mapping) or not isinstance(exprs, list):
            raise InvalidInput("selector: matchLabels must be a map and matchExpressions a list")
        reqs = []
        for raw in exprs:
            if not isinstance(raw, Mapping):
                raise InvalidInput(f"selector: expression {raw!r} is not a map")
            op_name = raw.get("operator")
            try:
                op = Operator(op_name)
            except ValueError:
                names = ", ".join(o.value for o in Operator)
                raise InvalidInput(
                    f"selector: operator {op_name!r} is not one of {names}"
                ) from None
            values = raw.get("values") or []
            if not isinstance(values, list):
                raise InvalidInput("selector: values must be a list")
            reqs.append(Requirement(str(raw.get("key", "")), op, tuple(str(v) for v in values)))
        pairs = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        return Selector(pairs, tuple(reqs))
