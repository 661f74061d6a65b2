"""Label selectors over GPU labels: the six operators, Gt/Lt on quantities, errors."""

from __future__ import annotations

import pytest

from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.selector import Operator, Requirement, Selector

LABELS = {"gpupool.io/model": "A100", "gpupool.io/memory": "40960Mi", "tier": "gold",
          "clock": "1410M", "count": "8"}


def expr(key: str, op: str, *values: str) -> Selector:
    return Selector.from_spec({"matchExpressions": [
        {"key": key, "operator": op, "values": list(values)}]})


@pytest.mark.parametrize(("selector", "matches"), [
    (expr("tier", "In", "gold", "silver"), True),
    (expr("tier", "In", "bronze"), False),
    (expr("missing", "In", "x"), False),
    (expr("tier", "NotIn", "bronze"), True),
    (expr("tier", "NotIn", "gold"), False),
    (expr("missing", "NotIn", "x"), True),
    (expr("tier", "Exists"), True),
    (expr("missing", "Exists"), False),
    (expr("missing", "DoesNotExist"), True),
    (expr("tier", "DoesNotExist"), False),
    (expr("gpupool.io/memory", "Gt", "10Gi"), True),
    (expr("gpupool.io/memory", "Gt", "40Gi"), False),
    (expr("gpupool.io/memory", "Gt", "39.9Gi"), True),
    (expr("gpupool.io/memory", "Lt", "80Gi"), True),
    (expr("gpupool.io/memory", "Lt", "40Gi"), False),
    (expr("gpupool.io/memory", "Gt", "42949672959"), True),
    (expr("clock", "Gt", "1.4G"), True),
    (expr("clock", "Lt", "1410000001"), True),
    (expr("count", "Gt", "7"), True),
    (expr("count", "Lt", "8"), False),
    (expr("tier", "Gt", "1"), False),
    (expr("missing", "Lt", "1"), False),
    (Selector.from_spec({"matchLabels": {"tier": "gold", "gpupool.io/model": "A100"}}), True),
    (Selector.from_spec({"matchLabels": {"tier": "silver"}}), False),
    (Selector.from_spec({"matchLabels": {"missing": ""}}), False),
    (Selector.from_spec({}), True),
    (Selector.from_spec({"matchLabels": {"tier": "gold"}, "matchExpressions": [
        {"key": "gpupool.io/memory", "operator": "Gt", "values": ["80Gi"]}]}), False),
], ids=["In hit", "In miss", "In on a missing key", "NotIn hit", "NotIn miss",
        "NotIn on a missing key", "Exists", "Exists missing", "DoesNotExist missing",
        "DoesNotExist present", "40960Mi Gt 10Gi", "40Gi is not Gt 40Gi", "Gt 39.9Gi",
        "Lt 80Gi", "40Gi is not Lt 40Gi", "Gt one byte less", "1410M Gt 1.4G",
        "Lt a plain number", "8 Gt 7", "8 is not Lt 8", "Gt on a word is false",
        "Lt on a missing key is false", "matchLabels hit", "matchLabels miss",
        "matchLabels on a missing key", "the empty selector", "labels and expressions ANDed"])
def test_a_selector_matches_gpu_labels(selector: Selector, matches: bool) -> None:
    assert selector.matches(LABELS) is matches


@pytest.mark.parametrize(("spec", "error", "needle"), [
    ({"matchExpressions": [{"key": "a", "operator": "Like", "values": ["x"]}]}, InvalidInput,
     "operator 'Like' is not one of In, NotIn"),
    ({"matchExpressions": [{"key": "a", "operator": "In"}]}, InvalidInput, "at least one"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, InvalidInput,
     "takes no values"),
    ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1", "2"]}]}, InvalidInput,
     "exactly one value"),
    ({"matchExpressions": [{"key": "a", "operator": "Lt", "values": ["big"]}]}, QuantityError,
     "not a Kubernetes quantity"),
    ({"matchExpressions": [{"key": "", "operator": "Exists"}]}, InvalidInput, "empty key"),
    ({"matchExpressions": ["a Exists"]}, InvalidInput, "is not a map"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}, InvalidInput,
     "values must be a list"),
    ({"matchLabels": ["a"]}, InvalidInput, "matchLabels must be a map"),
    ({"matchExpressions": {"key": "a"}}, InvalidInput, "matchExpressions a list"),
], ids=["unknown operator", "In without values", "Exists with values", "Gt with two values",
        "Lt with a word", "empty key", "expression not a map", "values not a list",
        "matchLabels not a map", "matchExpressions not a list"])
def test_a_bad_selector_is_refused_with_the_reason(spec: dict[str, object], error: type,
                                                   needle: str) -> None:
    with pytest.raises(error, match=needle):
        Selector.from_spec(spec)


def test_a_selector_describes_itself_and_is_hashable() -> None:
    s = Selector.from_spec({"matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [
        {"key": "m", "operator": "Gt", "values": ["10Gi"]}, {"key": "x", "operator": "Exists"}]})
    assert s.describe() == "a=1, b=2, m Gt 10Gi, x Exists"
    assert Selector().describe() == "(everything)"
    assert hash(s) == hash(Selector.from_spec({"matchLabels": {"a": "1", "b": "2"},
                                               "matchExpressions": [
        {"key": "m", "operator": "Gt", "values": ["10Gi"]}, {"key": "x", "operator": "Exists"}]}))
    assert Requirement("k", Operator.IN, ("a",)).describe() == "k In a"
