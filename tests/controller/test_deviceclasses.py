"""DeviceClasses for DRA nodes: class selectors as CEL that agrees with the core's
selector on every case (evaluated with a real CEL implementation over the attributes the
node agent publishes), and the classes the controller writes to the FAKE API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy import celtypes
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import dra
from gpupool.contract.devices import read_device
from gpupool.controller.celselector import cel_quantity, class_cel
from gpupool.controller.deviceclasses import DeviceClassSync
from gpupool.controller.loop import Controller
from gpupool.core.errors import InvalidInput, QuantityError
from gpupool.core.quantity import parse_quantity
from gpupool.core.selector import Selector
from gpupool.kube.api import DraApi
from gpupool.kube.controller_ops import ControllerApi
from gpupool.nodeagent.dra.slices import attributes
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.inventory import device_object
from tests.controller.builders import device, model_selector, resource_class

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "dra-v1"


# -- CEL, evaluated as Kubernetes' CEL environment does (quantity library) --------------------
class _Quantity:
    def __init__(self, value: Any):
        self.value = parse_quantity(str(value))


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        parse_quantity(str(text))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(a: _Quantity, b: _Quantity) -> celtypes.IntType:
    return celtypes.IntType((a.value > b.value) - (a.value < b.value))


ENV = celpy.Environment()
FUNCTIONS = {"quantity": _Quantity, "isQuantity": _is_quantity, "compareTo": _compare}


def cel_device(gpu: GpuInfo, labels: dict[str, str]) -> Any:
    """A device as CEL sees it: attributes by domain (the driver's for unqualified names;
    every domain present, as Kubernetes gives an absent domain as an empty map)."""
    published = attributes(gpu, labels, {})
    domains: dict[str, dict[str, Any]] = {dra.DRIVER: {}, dra.LABEL_DOMAIN: {},
                                          "gpupool.io": {}, "example.com": {}}
    for name, value in published.items():
        domain, _, ident = name.rpartition("/")
        domains.setdefault(domain or dra.DRIVER, {})[ident] = next(iter(value.values()))
    return celpy.json_to_cel({"driver": dra.DRIVER, "attributes": domains})


def cel_matches(expression: str, dev: Any) -> bool:
    program = ENV.program(ENV.compile(expression), functions=FUNCTIONS)
    result = program.evaluate({"device": dev})
    assert isinstance(result, celtypes.BoolType), f"{expression} gave {result!r}"
    return bool(result)


GPU_LABELS = [
    ("A100-SXM4-80GB", 81920, {"tier": "gold", "example.com/nv-link": "yes",
                               "example.com/mem": "40Gi"}),
    ("T4", 15360, {"tier": "silver", "weird": "not-a-quantity"}),
    ("H100", 40960, {"example.com/mem": "80Gi", "quote": "it's"}),
    ("L4", 24576, {}),
]
GPUS = [GpuInfo(f"GPU-{i}", i, model, memory, architecture="ampere", labels=tuple(
    sorted(extra.items()))) for i, (model, memory, extra) in enumerate(GPU_LABELS)]


def core_labels(gpu: GpuInfo) -> dict[str, str]:
    """The labels the core's selector reads for this GPU, as the extender reads them."""
    return read_device(device_object("n1", gpu, _NOW)).gpu.label_map()


_NOW = __import__("datetime").datetime(2026, 1, 1)

SELECTORS: list[dict[str, Any]] = [
    {},
    {"matchLabels": {"gpupool.io/model": "T4"}},
    {"matchLabels": {"gpupool.io/model": "T4", "tier": "silver"}},
    model_selector("A100-SXM4-80GB", "H100"),
    {"matchExpressions": [{"key": "gpupool.io/model", "operator": "NotIn",
                           "values": ["T4", "L4"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
    {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
    {"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Gt", "values": ["40Gi"]}]},
    {"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Lt", "values": ["40Gi"]}]},
    {"matchExpressions": [{"key": "gpupool.io/memory", "operator": "Gt",
                           "values": ["40960Mi"]}]},
    {"matchExpressions": [{"key": "gpupool.io/index", "operator": "Lt", "values": ["1.5"]}]},
    {"matchExpressions": [{"key": "gpupool.io/index", "operator": "Gt", "values": ["500m"]}]},
    {"matchExpressions": [{"key": "weird", "operator": "Gt", "values": ["0"]}]},
    {"matchExpressions": [{"key": "weird", "operator": "Lt", "values": ["1e3"]}]},
    {"matchExpressions": [{"key": "missing", "operator": "Gt", "values": ["0"]}]},
    {"matchExpressions": [{"key": "missing", "operator": "NotIn", "values": ["x"]}]},
    {"matchExpressions": [{"key": "example.com/mem", "operator": "Gt", "values": ["50Gi"]}]},
    {"matchExpressions": [{"key": "example.com/nv-link", "operator": "In",
                           "values": ["yes"]}]},
    {"matchExpressions": [{"key": "quote", "operator": "In", "values": ["it's", "a\\b"]}]},
    {"matchExpressions": [{"key": "gpupool.io/architecture", "operator": "In",
                           "values": ["ampere"]},
                          {"key": "gpupool.io/memory", "operator": "Gt", "values": ["16Gi"]},
                          {"key": "tier", "operator": "NotIn", "values": ["gold"]}]},
    {"matchExpressions": [{"key": "gpupool.io/isolation-provider", "operator": "DoesNotExist"}]},
]


@pytest.mark.parametrize("spec", SELECTORS, ids=[json.dumps(s) for s in SELECTORS])
def test_the_cel_of_a_class_selects_exactly_the_gpus_the_core_selector_does(
        spec: dict[str, Any]) -> None:
    selector = Selector.from_spec(spec)
    expression = class_cel(selector)
    for gpu in GPUS:
        labels = core_labels(gpu)
        assert cel_matches(expression, cel_device(gpu, labels)) == selector.matches(labels), \
            (gpu.model, expression)


def test_every_case_of_the_table_is_met_both_ways() -> None:
    outcomes = {(json.dumps(s), Selector.from_spec(s).matches(core_labels(g)))
                for s in SELECTORS for g in GPUS}
    per_selector = {s for s, _ in outcomes}
    assert any(not m for _, m in outcomes) and any(m for _, m in outcomes)
    assert len(per_selector) == len(SELECTORS)


def test_a_label_that_cannot_be_an_attribute_name_has_no_translation() -> None:
    selector = Selector.from_spec({"matchExpressions": [
        {"key": "example.com/" + "x" * 40, "operator": "Exists"}]})
    with pytest.raises(InvalidInput, match="cannot be a device attribute"):
        class_cel(selector)


def test_bounds_are_written_as_canonical_quantities() -> None:
    assert [cel_quantity(v) for v in ("40Gi", "1.5", "500m", "1e3", " 7 ")] == [
        str(40 * 2**30), "1500m", "500m", "1000", "7"]


# -- the DeviceClasses the controller writes ---------------------------------------------------
@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def run_once(fake: FakeApiServer, extended: bool = False) -> Any:
    api = ControllerApi.open(server=fake.url)
    dra_api = DraApi.connect(server=fake.url)
    assert isinstance(dra_api, DraApi)
    try:
        return Controller(api, verify=None,
                          device_classes=DeviceClassSync(dra_api, extended)).reconcile_once()
    finally:
        api.close()
        dra_api.close()


def classes(fake: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in fake.objects("deviceclasses")}


def test_the_controller_writes_a_driver_class_and_one_per_class_and_model(
        fake: FakeApiServer) -> None:
    fake.seed("gpudevices", device("n1", 0))
    fake.seed("gpudevices", device("n1", 1, "T4", 15 * 1024))
    fake.seed("resourceclasses", resource_class("big-mem", {"matchExpressions": [
        {"key": "gpupool.io/memory", "operator": "Gt", "values": ["40Gi"]}]}))
    out = run_once(fake)
    assert sorted(classes(fake)) == ["a100-sxm4-80gb.gpupool.io", "big-mem.gpupool.io",
                                     "gpu.gpupool.io", "mig.gpupool.io", "t4.gpupool.io"]
    assert "create DeviceClass gpu.gpupool.io" in out.device_classes and out.failures == []
    big = classes(fake)["big-mem.gpupool.io"]
    assert big["spec"]["selectors"][0]["cel"]["expression"].startswith(
        "device.driver == 'gpu.gpupool.io' && ('memory' in device.attributes['gpupool.io']")
    out = run_once(fake)  # the default ResourceClasses now exist: same DeviceClasses
    assert sorted(classes(fake)) == ["a100-sxm4-80gb.gpupool.io", "big-mem.gpupool.io",
                                     "gpu.gpupool.io", "mig.gpupool.io", "t4.gpupool.io"]
    assert classes(fake)["t4.gpupool.io"]["metadata"]["annotations"] == {
        "gpupool.io/resource-class": "t4"}


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures/dra-v1 absent")
def test_the_classes_have_the_shape_of_the_recorded_v1_36_classes(fake: FakeApiServer) -> None:
    fake.seed("resourceclasses", resource_class("big-mem", {"matchExpressions": [
        {"key": "gpupool.io/memory", "operator": "Gt", "values": ["40Gi"]}]}))
    run_once(fake)
    recorded = json.loads((FIXTURES / "deviceclasses-cel.json").read_text())["items"]
    theirs = {o["metadata"]["name"]: o for o in recorded}
    ours = classes(fake)
    assert ours["gpu.gpupool.io"]["spec"] == theirs["gpu.gpupool.io"]["spec"]
    for o in ours.values():
        assert o["apiVersion"] == "resource.k8s.io/v1" and o["kind"] == "DeviceClass"
        assert set(o["spec"]) == set(theirs["big-mem.gpupool.io"]["spec"])
        assert list(o["spec"]["selectors"][0]) == ["cel"]


def test_changed_and_removed_classes_follow_and_users_classes_are_left_alone(
        fake: FakeApiServer) -> None:
    fake.seed("resourceclasses", resource_class("fast", model_selector("H100")))
    fake.seed("deviceclasses", {"metadata": {"name": "mine.gpupool.io"},
                                "spec": {"selectors": [{"cel": {"expression": "true"}}]}})
    run_once(fake)
    fake.patch("resourceclasses", "fast", {"spec": {"selector": model_selector("B200")}})
    out = run_once(fake)
    assert "replace DeviceClass fast.gpupool.io" in out.device_classes
    assert "'B200'" in classes(fake)["fast.gpupool.io"]["spec"]["selectors"][0]["cel"][
        "expression"]
    fake.delete("resourceclasses", "fast")
    out = run_once(fake)
    assert "delete DeviceClass fast.gpupool.io" in out.device_classes
    assert sorted(classes(fake)) == ["gpu.gpupool.io", "mig.gpupool.io", "mine.gpupool.io"]


def test_extended_resource_names_are_given_only_when_asked(fake: FakeApiServer) -> None:
    fake.seed("resourceclasses", resource_class("fast", model_selector("H100")))
    run_once(fake)
    assert all("extendedResourceName" not in o["spec"] for o in classes(fake).values())
    run_once(fake, extended=True)
    names = {n: o["spec"].get("extendedResourceName") for n, o in classes(fake).items()}
    assert names == {"gpu.gpupool.io": "gpupool.io/gpu", "mig.gpupool.io": None,
                     "fast.gpupool.io": "class.gpupool.io/fast"}


def test_an_untranslatable_class_is_a_note_not_a_failure(fake: FakeApiServer) -> None:
    fake.seed("resourceclasses", resource_class("odd", {"matchExpressions": [
        {"key": "example.com/" + "y" * 40, "operator": "Exists"}]}))
    out = run_once(fake)
    assert out.failures == []
    assert any("ResourceClass odd has no DeviceClass" in n for n in out.notes)
    assert "odd.gpupool.io" not in classes(fake)


def test_classes_of_whole_gpus_leave_mig_devices_out_and_the_mig_class_takes_them(
        fake: FakeApiServer) -> None:
    fake.seed("resourceclasses", resource_class("fast", model_selector("H100")))
    fake.seed("resourceclasses", resource_class("small-mig", {"matchLabels": {
        "gpupool.io/mig-profile": "1g.10gb"}}))
    run_once(fake)
    cel = {n: o["spec"]["selectors"][0]["cel"]["expression"] for n, o in classes(fake).items()}
    assert cel["fast.gpupool.io"].endswith("&& !('mig_hprofile' in device.attributes"
                                           "['gpupool.io'])")
    assert "!('mig_hprofile'" not in cel["small-mig.gpupool.io"]
    assert cel["mig.gpupool.io"] == ("device.driver == 'gpu.gpupool.io' && 'mig_hprofile' in "
                                     "device.attributes['gpupool.io']")
