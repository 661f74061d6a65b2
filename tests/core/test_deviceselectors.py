"""DRA device selectors: Kubernetes' CEL device environment (attributes by domain, capacity
as quantities, versions as semver) evaluated on the recorded v1.36 slice's devices; errors
mean no match and say why; results are memoised without changing a verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.core.celkube import parse_semver
from gpupool.core.deviceselectors import (
    MAX_EXPRESSION_LENGTH,
    CelDevice,
    DeviceSelectors,
    device_of,
)

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "dra-v1"
DRIVER = "gpu.gpupool.io"
RECORDED_SLICE: dict[str, Any] = {  # devices of resourceslice-consumable-capacity.json
    "driver": DRIVER, "devices": [
        {"name": "gpu-0", "allowMultipleAllocations": True, "attributes": {
            "architecture": {"string": "ampere"}, "index": {"int": 0},
            "model": {"string": "A100-SXM4-80GB"}, "numaNode": {"int": 0},
            "uuid": {"string": "GPU-aaaa0000-0000-0000-0000-000000000000"}},
         "capacity": {"cores": {"value": "100"}, "memory": {"value": "80Gi"}}},
        {"name": "gpu-1", "allowMultipleAllocations": True, "attributes": {
            "architecture": {"string": "turing"}, "index": {"int": 2},
            "model": {"string": "T4"}, "numaNode": {"int": 1},
            "uuid": {"string": "GPU-bbbb0000-0000-0000-0000-000000000002"}},
         "capacity": {"cores": {"value": "100"}, "memory": {"value": "15Gi"}}}]}


def recorded_devices() -> list[CelDevice]:
    spec = RECORDED_SLICE
    path = FIXTURES / "resourceslice-consumable-capacity.json"
    if path.is_file():
        spec = json.loads(path.read_text())["spec"]
    return [device_of(d, spec["driver"]) for d in spec["devices"]]


def test_the_recorded_slice_is_the_one_the_table_describes() -> None:
    if not (FIXTURES / "resourceslice-consumable-capacity.json").is_file():
        pytest.skip("../shared/fixtures/dra-v1 absent")
    fixture = json.loads((FIXTURES / "resourceslice-consumable-capacity.json").read_text())
    assert recorded_devices() == [device_of(d, DRIVER) for d in RECORDED_SLICE["devices"]]
    assert fixture["spec"]["driver"] == DRIVER


A100, T4 = (True, False), (False, True)
BOTH, NEITHER = (True, True), (False, False)
TABLE: list[tuple[str, tuple[bool, bool]]] = [
    ("device.driver == 'gpu.gpupool.io'", BOTH),
    ("device.attributes['gpu.gpupool.io'].model == 'T4'", T4),
    ("device.attributes['gpu.gpupool.io']['model'] in ['A100-SXM4-80GB', 'H100']", A100),
    ("device.attributes['gpu.gpupool.io'].architecture != 'turing'", A100),
    ("device.attributes['gpu.gpupool.io'].index >= 1", T4),
    ("device.attributes['gpu.gpupool.io'].numaNode == 0", A100),
    ("'model' in device.attributes['gpu.gpupool.io']", BOTH),
    ("'model' in device.attributes['example.com']", NEITHER),  # an absent domain: empty map
    ("!('model' in device.attributes['example.com'])", BOTH),
    ("has(device.attributes['gpu.gpupool.io'].uuid)", BOTH),
    ("device.attributes['gpu.gpupool.io'].uuid.startsWith('GPU-bbbb')", T4),
    ("device.allowMultipleAllocations", BOTH),
    ("device.capacity['gpu.gpupool.io'].memory.compareTo(quantity('40Gi')) > 0", A100),
    ("device.capacity['gpu.gpupool.io'].memory.compareTo(quantity('15Gi')) == 0", T4),
    ("device.capacity['gpu.gpupool.io'].memory == quantity('15360Mi')", T4),
    ("device.capacity['gpu.gpupool.io'].memory.isGreaterThan(quantity('16Gi'))", A100),
    ("device.capacity['gpu.gpupool.io'].memory.isLessThan(quantity('17G'))", T4),
    ("device.capacity['gpu.gpupool.io'].cores.asInteger() == 100", BOTH),
    ("device.capacity['gpu.gpupool.io'].memory.sub(quantity('10Gi'))"
     ".isGreaterThan(quantity('60Gi'))", A100),
    ("device.capacity['gpu.gpupool.io'].cores.add(1).compareTo(quantity('101')) == 0", BOTH),
    ("quantity('1') == quantity('1000m') && isQuantity('10Gi') && !isQuantity('ten')", BOTH),
    ("quantity('1.5').isInteger()", NEITHER),
    ("quantity('-2').sign() == -1", BOTH),
    ("semver('1.10.0').isGreaterThan(semver('1.9.9'))", BOTH),
    ("semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))", BOTH),
    ("semver('1.0.0-alpha.2').compareTo(semver('1.0.0-alpha.10')) < 0", BOTH),
    ("semver('2.3.4').major() == 2 && semver('2.3.4').minor() == 3 "
     "&& semver('2.3.4').patch() == 4 && isSemver('1.2.3') && !isSemver('1.2')", BOTH),
    ("semver('1.2.3+build.7') == semver('1.2.3')", BOTH),
]


@pytest.mark.parametrize(("expression", "expected"), TABLE, ids=[e for e, _ in TABLE])
def test_kubernetes_dra_cel_environment_on_the_recorded_devices(
        expression: str, expected: tuple[bool, bool]) -> None:
    selectors = DeviceSelectors()
    verdicts = [selectors.verdict(expression, d) for d in recorded_devices()]
    assert [v.error for v in verdicts] == ["", ""]
    assert tuple(v.matches for v in verdicts) == expected


ERRORS = [
    ("device.attributes['gpu.gpupool.io'].nothere == 'x'", "runtime error: no such member"),
    ("device.attributes['gpu.gpupool.io'].model.matches('(')", "runtime error"),
    ("quantity('ten') == quantity('10')", "runtime error: quantity 'ten'"),
    ("quantity('1.5').asInteger() == 1", "cannot convert value 3/2 to integer"),
    ("quantity('1Ei').mul(2)", "runtime error"),  # not a function of the environment
    ("semver('1.2') == semver('1.2.0')", "not a semantic version"),
    ("device.capacity['gpu.gpupool.io'].memory.compareTo(semver('1.0.0')) > 0",
     "runtime error"),
    ("device.attributes['gpu.gpupool.io'].index", "must evaluate to bool, not IntType"),
    ("device.attributes['gpu.gpupool.io'].model == ", "does not compile: syntax error"),
    ("device.driver == 'gpu.gpupool.io' &&& true", "does not compile"),
    ("'" + "x" * MAX_EXPRESSION_LENGTH + "' == ''", "longer than 10240 characters"),
]


@pytest.mark.parametrize(("expression", "words"), ERRORS, ids=[e[:60] for e, _ in ERRORS])
def test_an_expression_that_errors_or_does_not_compile_matches_no_device_and_says_why(
        expression: str, words: str) -> None:
    selectors = DeviceSelectors()
    for device in recorded_devices():
        verdict = selectors.verdict(expression, device)
        assert not verdict.matches
        assert words in verdict.error


def test_a_device_whose_version_attribute_does_not_parse_matches_nothing() -> None:
    raw = {"name": "gpu-9", "attributes": {"driverVersion": {"version": "550.x"}}}
    device = device_of(raw, DRIVER)
    verdict = DeviceSelectors().verdict("true", device)
    assert not verdict.matches and "driverVersion" in verdict.error


def test_attributes_are_read_by_domain_the_drivers_when_they_name_none() -> None:
    raw = {"name": "gpu-0", "attributes": {
        "model": {"string": "H100"}, "gpupool.io/model": {"string": "H100"},
        "labels.gpupool.io/tier": {"string": "gold"}, "ready": {"bool": True},
        "driverVersion": {"version": "570.86.10"}, "odd": {"float": 1.5}}}
    device = device_of(raw, DRIVER)
    assert [(d, n) for d, n, _ in device.attributes] == [
        ("gpu.gpupool.io", "driverVersion"), ("gpu.gpupool.io", "model"),
        ("gpu.gpupool.io", "ready"), ("gpupool.io", "model"), ("labels.gpupool.io", "tier")]
    selectors = DeviceSelectors()
    expression = ("device.attributes['gpupool.io'].model == 'H100' && "
                  "device.attributes['labels.gpupool.io'].tier == 'gold' && "
                  "device.attributes['gpu.gpupool.io'].ready && "
                  "device.attributes['gpu.gpupool.io'].driverVersion == semver('570.86.10')")
    assert selectors.verdict(expression, device).matches
    assert parse_semver("570.86.10") in [v for _, _, v in device.attributes]


def fleet(n: int) -> list[CelDevice]:
    models = ("A100", "H100", "T4")
    return [device_of({"name": f"gpu-{i}", "attributes": {
        "model": {"string": models[i % 3]}, "uuid": {"string": f"GPU-{i}"},
        "index": {"int": i % 8}}, "capacity": {"memory": {"value": "80Gi"}}}, DRIVER)
        for i in range(n)]


def test_a_selector_runs_once_per_reading_of_the_device_not_once_per_device() -> None:
    devices = fleet(600)
    memo, fresh = DeviceSelectors(), DeviceSelectors(results=1)
    expression = "device.attributes['gpu.gpupool.io'].model == 'H100'"
    memoised = [memo.verdict(expression, d).matches for d in devices]
    assert memo.evaluations == 3  # three models: three readings
    assert memoised == [fresh.verdict(expression, d).matches for d in devices[:30]] + \
        [memo.verdict(expression, d).matches for d in devices[30:]]
    assert sum(memoised) == 200


def test_a_reading_that_depends_on_the_device_identity_is_not_shared() -> None:
    devices = fleet(30)
    selectors = DeviceSelectors()
    expression = "device.attributes['gpu.gpupool.io'].uuid.endsWith('7')"
    got = [selectors.verdict(expression, d).matches for d in devices]
    assert got == [d.attributes[-1][2].endswith("7") for d in devices]  # type: ignore[union-attr]
    assert selectors.evaluations == 30


def test_an_expression_that_looks_at_a_whole_map_is_memoised_per_device_only() -> None:
    devices = fleet(9)
    selectors = DeviceSelectors()
    expression = "size(device.attributes['gpu.gpupool.io']) == 3"
    assert all(selectors.verdict(expression, d).matches for d in devices)
    assert selectors.evaluations == 9
    assert all(selectors.verdict(expression, d).matches for d in devices)
    assert selectors.evaluations == 9


def test_compiled_programs_are_bounded_and_kept_in_use_order() -> None:
    selectors = DeviceSelectors(programs=2)
    device = fleet(1)[0]
    for k in range(5):
        assert selectors.verdict(f"device.attributes['gpu.gpupool.io'].index == {k}",
                                 device).matches == (k == 0)
    assert len(selectors._programs) == 2
