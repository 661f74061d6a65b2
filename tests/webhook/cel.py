"""The shipped CEL, evaluated with cel-python (celpy) the way kube-apiserver evaluates it.

``Policy`` reads a ValidatingAdmissionPolicy (resource rules, matchConditions,
variables, validations with message/messageExpression; an expression that errors
denies, as ``failurePolicy: Fail`` does). ``conditions`` evaluates a webhook's
matchConditions. Inputs are admission request dicts as the webhook tests build them
(``builders.review(...)["request"]``). The expressions stay within what cel-go and
celpy both implement (no extension functions, no ``x != null`` on objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

_ENV = celpy.Environment()


def _program(expression: str) -> Any:
    return _ENV.program(_ENV.compile(expression))


def _activation(request: Mapping[str, Any]) -> dict[str, Any]:
    return {"request": celpy.json_to_cel(dict(request)),
            "object": celpy.json_to_cel(request.get("object")),
            "oldObject": celpy.json_to_cel(request.get("oldObject"))}


def _truth(program: Any, activation: Mapping[str, Any]) -> bool | None:
    """True/False, or None when the expression errors."""
    try:
        value = program.evaluate(dict(activation))
    except celpy.CELEvalError:
        return None
    return bool(value) if isinstance(value, celtypes.BoolType) else None


def conditions(hook: Mapping[str, Any], request: Mapping[str, Any]) -> bool | None:
    """Whether a webhook's matchConditions send it ``request`` (None: one errored)."""
    act = _activation(request)
    results = [_truth(_program(c["expression"]), act) for c in hook.get("matchConditions", [])]
    if None in results:
        return None
    return all(results)


@dataclass(frozen=True)
class Outcome:
    applies: bool
    allowed: bool
    message: str = ""


class Policy:
    """A ValidatingAdmissionPolicy, compiled."""

    def __init__(self, doc: Mapping[str, Any]):
        spec = doc["spec"]
        self.failure_policy = spec.get("failurePolicy", "Fail")
        self.rules = spec["matchConstraints"]["resourceRules"]
        self.matches = [_program(c["expression"]) for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], _program(v["expression"])) for v in spec.get("variables",
                                                                                   [])]
        self.validations = [(_program(v["expression"]), v.get("message", ""),
                             _program(v["messageExpression"]) if "messageExpression" in v
                             else None) for v in spec["validations"]]

    def _selects(self, request: Mapping[str, Any]) -> bool:
        res = request["resource"]
        name = res["resource"] + (f"/{request['subResource']}" if request.get("subResource")
                                  else "")
        return any(res["group"] in r["apiGroups"] and name in r["resources"]
                   and request["operation"] in r["operations"] for r in self.rules)

    def admit(self, request: Mapping[str, Any]) -> Outcome:
        if not self._selects(request):
            return Outcome(False, True)
        act = _activation(request)
        for match in self.matches:
            result = _truth(match, act)
            if result is None:
                return Outcome(True, False, "a matchCondition errored")
            if not result:
                return Outcome(False, True)
        values: dict[Any, Any] = {}
        for name, program in self.variables:
            try:
                values[celtypes.StringType(name)] = program.evaluate(
                    {**act, "variables": celtypes.MapType(values)})
            except celpy.CELEvalError as exc:
                return Outcome(True, False, f"variable {name} errored: {exc}")
        act["variables"] = celtypes.MapType(values)
        for check, message, message_expression in self.validations:
            result = _truth(check, act)
            if result is None:
                return Outcome(True, False, "a validation errored (failurePolicy Fail)")
            if not result:
                text = str(message_expression.evaluate(act)) if message_expression else message
                return Outcome(True, False, text)
        return Outcome(True, True)
