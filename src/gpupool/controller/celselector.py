"""A resource class's label selector as a DRA CEL expression over device attributes.

The node agent in DRA mode publishes every label a class can select on as a string
attribute (``gpupool.contract.dra.label_attribute``: ``gpupool.io/model`` ->
``device.attributes['gpupool.io']['model']``). Each requirement becomes CEL that is true
exactly when ``gpupool.core.selector`` matches the same labels:

=================  =====================================================================
``k=v`` (labels)   ``'k' in A && A['k'] == 'v'``
``In``             ``'k' in A && A['k'] in ['a', 'b']``
``NotIn``          ``!('k' in A) || !(A['k'] in ['a', 'b'])``
``Exists``         ``'k' in A``
``DoesNotExist``   ``!('k' in A)``
``Gt`` / ``Lt``    ``'k' in A && isQuantity(A['k']) && quantity(A['k']).compareTo(
                   quantity('40Gi')) > 0`` (``< 0`` for Lt); a value that is no quantity
                   matches neither, as in the core
=================  =====================================================================

where ``A`` is ``device.attributes['<domain>']`` (an absent domain is an empty map in
Kubernetes' CEL environment, so ``in`` is safe) and every check short-circuits before
a missing attribute is read, so the expression never errors (an error would fail the
whole allocation in kube-scheduler). Requirements are joined with ``&&``; the empty
selector is ``true``. A selector on a label that cannot be an attribute name
(``label_attribute`` is None) or with a bound finer than a nano-unit raises
``InvalidInput``: the class then gets no DeviceClass, and the controller says why.
"""

from __future__ import annotations

from gpupool.contract import dra
from gpupool.core.errors import InvalidInput
from gpupool.core.quantity import parse_quantity
from gpupool.core.selector import Operator, Requirement, Selector

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def cel_string(text: str) -> str:
    """A CEL single-quoted string literal of ``text``."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "'" + "".join(out) + "'"


def cel_quantity(text: str) -> str:
    """A bound as a canonical quantity literal Kubernetes parses to the same value."""
    value = parse_quantity(text)
    for scale, suffix in ((1, ""), (1000, "m"), (10**6, "u"), (10**9, "n")):
        scaled = value * scale
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    raise InvalidInput(f"quantity {text!r} is finer than 1n, which DRA CEL cannot compare")


def _place(key: str) -> tuple[str, str]:
    where = dra.label_attribute(key)
    if where is None:
        raise InvalidInput(f"label {key!r} cannot be a device attribute (its name part must "
                           "fit 32 characters, its prefix 63): DRA cannot select on it")
    domain, ident = where
    return f"device.attributes[{cel_string(domain)}]", cel_string(ident)


def requirement_cel(req: Requirement) -> str:
    attrs, key = _place(req.key)
    present = f"{key} in {attrs}"
    value = f"{attrs}[{key}]"
    op = req.operator
    if op is Operator.EXISTS:
        return present
    if op is Operator.DOES_NOT_EXIST:
        return f"!({present})"
    values = "[" + ", ".join(cel_string(v) for v in req.values) + "]"
    if op is Operator.IN:
        return f"({present} && {value} in {values})"
    if op is Operator.NOT_IN:
        return f"(!({present}) || !({value} in {values}))"
    sign = ">" if op is Operator.GT else "<"
    bound = cel_quantity(req.values[0])
    return (f"({present} && isQuantity({value}) && "
            f"quantity({value}).compareTo(quantity({cel_string(bound)})) {sign} 0)")


def selector_cel(selector: Selector) -> str:
    """The CEL of a whole selector (matchLabels and matchExpressions, all required)."""
    parts = [requirement_cel(Requirement(k, Operator.IN, (v,)))
             for k, v in selector.match_labels]
    parts += [requirement_cel(r) for r in selector.expressions]
    return " && ".join(parts) if parts else "true"


def class_cel(selector: Selector) -> str:
    """A DeviceClass selector: gpupool's driver and the class's selector."""
    driver = f"device.driver == {cel_string(dra.DRIVER)}"
    body = selector_cel(selector)
    return driver if body == "true" else f"{driver} && {body}"

