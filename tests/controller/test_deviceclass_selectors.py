"""The class CEL gpupool writes into DeviceClasses, evaluated by the product's own DRA CEL
evaluator (``gpupool.core.deviceselectors``, what the extender scores claims with), selects
exactly the GPUs the core's label selector selects — on the devices the node agent
publishes in its ResourceSlice, and on the devices the extender reads from GPUDevices
while no slice lists them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.contract import dra
from gpupool.contract.devices import read_device
from gpupool.controller.celselector import class_cel
from gpupool.core.deviceselectors import DeviceSelectors, device_of
from gpupool.core.selector import Selector
from gpupool.extender.dra.draselect import device_of_gpu
from gpupool.nodeagent.dra.slices import attributes, capacity
from gpupool.nodeagent.inventory import device_object
from tests.controller.test_deviceclasses import _NOW, GPUS, SELECTORS, core_labels

SELECTORS_ = DeviceSelectors()


def published(index: int) -> Any:
    """GPU ``index`` of the table as its node agent's ResourceSlice publishes it."""
    gpu = GPUS[index]
    labels = core_labels(gpu)
    entry = {"name": dra.device_name(gpu.index), "allowMultipleAllocations": True,
             "attributes": attributes(gpu, labels, {}), "capacity": capacity(gpu, 256)}
    return device_of(json.loads(json.dumps(entry)), dra.DRIVER)


def from_gpudevice(index: int) -> Any:
    """The same GPU as the extender reads it from its GPUDevice (no slice yet)."""
    return device_of_gpu(read_device(device_object("n1", GPUS[index], _NOW)).gpu, 256)


@pytest.mark.parametrize("spec", SELECTORS, ids=[json.dumps(s) for s in SELECTORS])
def test_the_class_cel_selects_what_the_core_selector_does_through_the_product_evaluator(
        spec: dict[str, Any]) -> None:
    selector = Selector.from_spec(spec)
    expression = class_cel(selector)
    for i, gpu in enumerate(GPUS):
        expected = selector.matches(core_labels(gpu))
        for device in (published(i), from_gpudevice(i)):
            verdict = SELECTORS_.verdict(expression, device)
            assert verdict.error == "", (gpu.model, expression, verdict.error)
            assert verdict.matches == expected, (gpu.model, expression)


def test_the_driver_class_selects_every_gpupool_device_and_no_other_drivers() -> None:
    expression = class_cel(Selector.from_spec({}))
    assert SELECTORS_.verdict(expression, published(0)).matches
    other = device_of({"name": "nic-0", "attributes": {"model": {"string": "T4"}}},
                      "nic.example.com")
    assert not SELECTORS_.verdict(expression, other).matches
