"""CEL device selectors of DRA claims and classes, evaluated as kube-scheduler evaluates them.

A selector is a CEL expression over one ``device`` (Kubernetes' DRA CEL environment):

* ``device.driver``: the driver's name;
* ``device.attributes[domain][name]``: the device's attributes by domain — an attribute
  published without a domain is in the driver's — as ``int``, ``bool``, ``string`` or a
  version (``semver``); a domain the device does not have is an empty map, so
  ``'model' in device.attributes['x']`` never errors;
* ``device.capacity[domain][name]``: its capacities as quantities;
* ``device.allowMultipleAllocations``: whether several claims may share it;
* the quantity and semver functions of ``gpupool.core.celkube``.

It must evaluate to a bool; anything else, a runtime error (a missing attribute read, a
bad ``quantity('x')``) or an expression that does not compile means the device does not
match: kube-scheduler fails the claim's allocation on such a device, so it is never a
device the claim can get. ``Verdict.error`` says what went wrong (the caller logs it).
Expressions longer than Kubernetes' limit (10 KiB) do not compile.

Cost: cel-python interprets, about 0.3 ms a device and expression. So each distinct
expression is compiled once (an LRU of ``programs`` programs), and results are memoised
two ways: per (expression, device) and per *reading*: while an expression is evaluated
the device's maps write down every value it reads (path and value); a later device
with the same values at those paths gets the same verdict without evaluating (the
evaluation could not have gone otherwise). A selector on ``model`` over 8,000 GPUs of
three models is thus evaluated about three times, not 8,000. An expression that looks
at the maps as a whole (iterates them, takes their size, compares them) is not memoised
that way, only per device.

Pure: no I/O, no clock; a ``DeviceSelectors`` is used by one thread at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes
from celpy.evaluation import CELEvalError, operator_in

from gpupool.core.celkube import (
    FUNCTIONS,
    Quantity,
    Semver,
    eval_message,
    first_line,
    parse_message,
    parse_semver,
)
from gpupool.core.errors import QuantityError
from gpupool.core.quantity import parse_quantity

MAX_EXPRESSION_LENGTH = 10 * 1024  # resource.k8s.io CELSelectorExpressionMaxLength
AttrValue = int | bool | str | Semver
Path = tuple[str, ...]
_ABSENT = ("<absent>",)  # a path the device does not have (compared by identity)
_DOMAIN = ("<domain>",)  # a domain the device has (read by ``'d' in device.attributes``)
_ROOT_LEAVES = ("driver", "allowMultipleAllocations")


@dataclass(frozen=True, slots=True)
class CelDevice:
    """One device as a selector sees it (hashable: it is a memo key; the hash is worked
    out once). Capacity values are ints when whole (cheaper to hash than fractions)."""

    driver: str
    attributes: tuple[tuple[str, str, AttrValue], ...] = ()  # (domain, name, value), sorted
    capacity: tuple[tuple[str, str, int | Fraction], ...] = ()  # (domain, name, value), sorted
    allow_multiple: bool = False
    problem: str = ""  # why the device cannot be evaluated (a version that does not parse)
    digest: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", hash((self.driver, self.attributes, self.capacity,
                                                 self.allow_multiple, self.problem)))

    def __hash__(self) -> int:
        return self.digest


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a device matches; ``error`` (then ``matches`` is False) says why not."""

    matches: bool
    error: str = ""


MATCH = Verdict(True)


def _qualified(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def device_of(raw: Mapping[str, Any], driver: str) -> CelDevice:
    """A ResourceSlice device entry (``spec.devices[i]``) of ``driver`` as a ``CelDevice``;
    values of unknown kinds are left out, a version that does not parse is the device's
    ``problem`` (kube-scheduler cannot evaluate a selector on it either)."""
    attrs: list[tuple[str, str, AttrValue]] = []
    problem = ""
    for name, value in _items(raw.get("attributes")):
        domain, ident = _qualified(name, driver)
        if not isinstance(value, Mapping):
            continue
        if isinstance(value.get("bool"), bool):
            attrs.append((domain, ident, value["bool"]))
        elif isinstance(value.get("int"), int):
            attrs.append((domain, ident, int(value["int"])))
        elif isinstance(value.get("string"), str):
            attrs.append((domain, ident, value["string"]))
        elif isinstance(value.get("version"), str):
            try:
                attrs.append((domain, ident, parse_semver(value["version"])))
            except ValueError as exc:
                problem = problem or f"attribute {name}: {exc}"
    caps: list[tuple[str, str, int | Fraction]] = []
    for name, value in _items(raw.get("capacity")):
        domain, ident = _qualified(name, driver)
        try:
            q = parse_quantity(_items_map(value).get("value", ""))
        except QuantityError:
            continue
        caps.append((domain, ident, q.numerator if q.denominator == 1 else q))
    return CelDevice(driver, tuple(sorted(attrs, key=lambda a: a[:2])), tuple(sorted(caps)),
                     raw.get("allowMultipleAllocations") is True, problem)


def _items(value: Any) -> Iterable[tuple[str, Any]]:
    return ((str(k), v) for k, v in value.items()) if isinstance(value, Mapping) else ()


def _items_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _cel(value: AttrValue) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return value  # Semver


def _native(value: Any) -> Any:
    """A CEL value as the plain value readings are compared by (cheap to build)."""
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.IntType):
        return int(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, Quantity):
        return ("quantity", value.value)
    return value  # Semver


def flat(device: CelDevice) -> dict[Path, Any]:
    """Every path a selector can read of ``device`` -> its value (as ``_native`` gives)."""
    out: dict[Path, Any] = {("driver",): device.driver,
                            ("allowMultipleAllocations",): device.allow_multiple}
    for domain, ident, value in device.attributes:
        out[("attributes", domain)] = _DOMAIN
        out[("attributes", domain, ident)] = value
    for domain, ident, amount in device.capacity:
        out[("capacity", domain)] = _DOMAIN
        out[("capacity", domain, ident)] = ("quantity", amount)
    return out


class _Probe:
    """What one evaluation read of the device."""

    __slots__ = ("opaque", "seen")

    def __init__(self) -> None:
        self.seen: dict[Path, Any] = {}
        self.opaque = False


class _Map(celtypes.MapType):
    """A map of the device that writes down, in its probe, what the expression reads."""

    def __init__(self, items: Mapping[Any, Any], probe: _Probe, path: Path,
                 empty_default: bool = False) -> None:
        super().__init__(dict(items))
        self.probe, self.path, self.empty_default = probe, path, empty_default

    def __getitem__(self, key: Any) -> Any:
        if not celtypes.MapType.valid_key_type(key):
            raise TypeError(f"unsupported key type: {type(key)}")
        path = (*self.path, str(key))
        if dict.__contains__(self, key):
            value = dict.__getitem__(self, key)
            if not isinstance(value, _Map):
                self.probe.seen[path] = _native(value)
            return value
        if self.empty_default:
            return _Map({}, self.probe, path)
        self.probe.seen[path] = _ABSENT
        raise KeyError(key)

    def has(self, key: Any) -> bool:
        path = (*self.path, str(key))
        found = dict.__contains__(self, key)
        value = dict.__getitem__(self, key) if found else _ABSENT
        self.probe.seen[path] = _DOMAIN if isinstance(value, _Map) else _native(value)
        return found

    def _whole(self) -> None:
        self.probe.opaque = True

    def __contains__(self, key: object) -> bool:
        return self.has(key)

    def __repr__(self) -> str:
        self._whole()
        return super().__repr__()

    __str__ = __repr__

    def __iter__(self) -> Any:
        self._whole()
        return super().__iter__()

    def __len__(self) -> int:
        self._whole()
        return super().__len__()

    def __eq__(self, other: Any) -> bool:
        self._whole()
        return bool(super().__eq__(other))

    def __ne__(self, other: Any) -> bool:
        self._whole()
        return bool(super().__ne__(other))

    __hash__ = None  # type: ignore[assignment]

    def keys(self) -> Any:
        self._whole()
        return super().keys()

    def values(self) -> Any:
        self._whole()
        return super().values()

    def items(self) -> Any:
        self._whole()
        return super().items()

    def get(self, key: Any, default: Any = None) -> Any:
        self._whole()
        return super().get(key, default)


def _in(item: Any, container: Any) -> Any:
    if isinstance(container, _Map) and not isinstance(item, CELEvalError):
        return celtypes.BoolType(container.has(item))
    return operator_in(item, container)


_FUNCTIONS = {**FUNCTIONS, "_in_": _in}


def _activation(device: CelDevice, probe: _Probe) -> dict[str, Any]:
    maps: dict[str, dict[str, dict[str, Any]]] = {"attributes": {}, "capacity": {}}
    for domain, ident, value in device.attributes:
        maps["attributes"].setdefault(domain, {})[ident] = _cel(value)
    for domain, ident, amount in device.capacity:
        maps["capacity"].setdefault(domain, {})[ident] = Quantity(Fraction(amount))
    root = {"driver": celtypes.StringType(device.driver),
            "allowMultipleAllocations": celtypes.BoolType(device.allow_multiple)}
    for kind, domains in maps.items():
        inner = {celtypes.StringType(d): _Map({celtypes.StringType(k): v for k, v in m.items()},
                                              probe, (kind, d)) for d, m in domains.items()}
        root[kind] = _Map(inner, probe, (kind,), empty_default=True)
    return {"device": _Map({celtypes.StringType(k): v for k, v in root.items()}, probe, ())}


_ENVIRONMENT: list[celpy.Environment] = []


def environment() -> celpy.Environment:
    """cel-python's environment, built once per process (building its parser takes about
    a second; every ``DeviceSelectors`` shares it)."""
    if not _ENVIRONMENT:
        _ENVIRONMENT.append(celpy.Environment())
    return _ENVIRONMENT[0]


class DeviceSelectors:
    """Compiles and evaluates selectors, remembering programs and verdicts (bounded)."""

    TRACES_PER_EXPRESSION = 64

    def __init__(self, programs: int = 256, results: int = 100_000) -> None:
        self._programs: OrderedDict[str, Any] = OrderedDict()  # expression -> program | error
        self._limit, self._results_limit = programs, results
        self._exact: dict[tuple[str, CelDevice], Verdict] = {}
        self._traces: dict[str, list[tuple[tuple[tuple[Path, Any], ...], Verdict]]] = {}
        self._flat: dict[CelDevice, dict[Path, Any]] = {}
        self.evaluations = 0  # how many times an expression really ran (for tests and benches)

    def compile(self, expression: str) -> Any:
        """The program of ``expression``, or the sentence why it does not compile."""
        found = self._programs.get(expression)
        if found is not None:
            self._programs.move_to_end(expression)
            return found
        program: Any
        if len(expression) > MAX_EXPRESSION_LENGTH:
            program = f"the expression is longer than {MAX_EXPRESSION_LENGTH} characters"
        else:
            try:
                env = environment()
                program = env.program(env.compile(expression), functions=_FUNCTIONS)
            except Exception as exc:  # any parser failure: no match
                program = f"does not compile: {parse_message(exc)}"
        self._programs[expression] = program
        if len(self._programs) > self._limit:
            dropped, _ = self._programs.popitem(last=False)
            self._traces.pop(dropped, None)
        return program

    def verdict(self, expression: str, device: CelDevice) -> Verdict:
        """Whether ``device`` matches ``expression`` (memoised)."""
        key = (expression, device)
        found = self._exact.get(key)
        if found is not None:
            return found
        result = self._by_trace(expression, device) or self._evaluate(expression, device)
        if len(self._exact) >= self._results_limit:
            self._exact.clear()
            self._flat.clear()
        self._exact[key] = result
        return result

    def verdict_all(self, expressions: Iterable[str], device: CelDevice) -> Verdict:
        """Whether ``device`` matches every expression (the first failure's verdict)."""
        for expression in expressions:
            v = self.verdict(expression, device)
            if not v.matches:
                return v
        return MATCH

    def _by_trace(self, expression: str, device: CelDevice) -> Verdict | None:
        traces = self._traces.get(expression)
        if not traces:
            return None
        values = self._flat.get(device)
        if values is None:
            values = self._flat[device] = flat(device)
        for seen, result in traces:
            if all(_same(values.get(p, _ABSENT), v) for p, v in seen):
                return result
        return None

    def _evaluate(self, expression: str, device: CelDevice) -> Verdict:
        program = self.compile(expression)
        if isinstance(program, str):
            return Verdict(False, program)
        if device.problem:
            return Verdict(False, device.problem)
        probe = _Probe()
        self.evaluations += 1
        try:
            value = program.evaluate(_activation(device, probe))
        except CELEvalError as exc:
            result = Verdict(False, f"runtime error: {eval_message(exc)}")
        except Exception as exc:  # no match, never a crash
            result = Verdict(False, f"runtime error: {type(exc).__name__}: {first_line(exc)}")
        else:
            result = Verdict(bool(value)) if isinstance(value, celtypes.BoolType) else Verdict(
                False, f"must evaluate to bool, not {type(value).__name__}")
        traces = self._traces.setdefault(expression, [])
        if not probe.opaque and len(traces) < self.TRACES_PER_EXPRESSION:
            traces.append((tuple(probe.seen.items()), result))
        return result


def _same(a: Any, b: Any) -> bool:
    if a is _ABSENT or b is _ABSENT or a is _DOMAIN or b is _DOMAIN:
        return a is b
    return type(a) is type(b) and bool(a == b)
