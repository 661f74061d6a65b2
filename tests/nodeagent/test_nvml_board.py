"""NVML topology, make, telemetry and health, through a FAKE libnvidia-ml built from the
example boards: every NVML call the backend makes, with its error codes."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pynvml
import pytest

from gpupool.core.topology import Link, PciePath
from gpupool.nodeagent import nvml, nvmlhealth, nvmltopology
from gpupool.nodeagent.dra import versions
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.health import HealthConfig, Level

from .fake_nvml import FakeNvml

BOARDS = Path(__file__).resolve().parents[2] / "examples" / "boards"
MIXED, PCIE, NVSWITCH = (BOARDS / f for f in ("mixed-dgx1-v100.yaml", "pcie-4-4-l40s.yaml",
                                              "nvswitch-8x-h100.yaml"))
LOST, NOT_SUPPORTED, NO_PERMISSION = (pynvml.NVML_ERROR_GPU_IS_LOST,
                                      pynvml.NVML_ERROR_NOT_SUPPORTED,
                                      pynvml.NVML_ERROR_NO_PERMISSION)
HEALTH_CALLS = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPagesPendingStatus",
                "nvmlDeviceGetRemappedRows", "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetTemperature",
                "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo", "nvmlDeviceGetFanSpeed")
FACT_CALLS = ("nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMaxClockInfo",
              "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetMaxPcieLinkGeneration",
              "nvmlDeviceGetMaxPcieLinkWidth")
TOPOLOGY_CALLS = ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemoteDeviceType",
                  "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkVersion",
                  "nvmlDeviceGetP2PStatus", "nvmlDeviceGetTopologyCommonAncestor")


def pynvml_names(module: object) -> set[str]:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "pynvml"}


def test_every_nvml_call_the_backend_makes_is_in_nvidia_ml_py_and_in_the_fake_driver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    used = set().union(*(pynvml_names(m) for m in (nvml, nvmlhealth, nvmltopology, versions)))
    assert sorted(n for n in used if not hasattr(pynvml, n)) == []
    calls = {n for n in used if n.startswith(("nvmlDevice", "nvmlSystem", "nvmlEvent",
                                                "nvmlInit", "nvmlShutdown"))
             and callable(getattr(pynvml, n))}
    assert {*HEALTH_CALLS, *FACT_CALLS, *TOPOLOGY_CALLS} <= calls
    assert calls - FakeNvml(monkeypatch, MIXED).names == set()


def links_by_index(gpus: tuple) -> dict[tuple[int, int], Link]:  # type: ignore[type-arg]
    index = {g.uuid: g.index for g in gpus}
    return {(g.index, index[peer]): link for g in gpus for peer, link in g.links}


@pytest.mark.parametrize(("board", "switch"), [(MIXED, False), (PCIE, False), (NVSWITCH, True)],
                         ids=["mixed board: direct NVLink", "PCIe board: common ancestors",
                              "NVSwitch board: links through the switches"])
def test_nvml_reads_the_same_links_as_the_fake_gpu_file_describes(
        monkeypatch: pytest.MonkeyPatch, board: Path, switch: bool) -> None:
    FakeNvml(monkeypatch, board, switch=switch)
    backend = nvml.NvmlGpuBackend()
    read = links_by_index(backend.discover())
    described = links_by_index(FakeGpuBackend(board).discover())
    assert read.keys() == described.keys()
    for pair, link in described.items():
        got = read[pair]
        assert (got.nvlinks, got.nvlink_version) == (link.nvlinks, link.nvlink_version), pair
        if not link.nvlinks:
            assert got.pcie == link.pcie, pair


def test_nvml_reads_the_make_of_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch, NVSWITCH, switch=True)
    facts = nvml.NvmlGpuBackend().discover()[0].facts
    assert (facts.compute_capability, facts.max_sm_clock_mhz, facts.max_memory_clock_mhz,
            facts.power_limit_w, facts.pcie_generation, facts.pcie_width,
            facts.driver_version, facts.cuda_version) == (
        "9.0", 1980, 2619, 700, 5, 16, "550.54.15", "12.4")


@pytest.mark.parametrize("error", [NOT_SUPPORTED, NO_PERMISSION, LOST])
@pytest.mark.parametrize("call", FACT_CALLS)
def test_a_fact_nvml_refuses_stays_empty_and_the_gpu_is_served(
        monkeypatch: pytest.MonkeyPatch, call: str, error: int) -> None:
    driver = FakeNvml(monkeypatch, MIXED)
    driver.fail(call, error, gpu=0)
    gpus = nvml.NvmlGpuBackend().discover()
    assert len(gpus) == 8 and gpus[1].facts.power_limit_w == 700
    f = gpus[0].facts
    assert f.driver_version == "550.54.15"
    if error == LOST:  # nothing more is asked of a lost GPU
        assert (f.compute_capability, f.power_limit_w, f.pcie_width) == ("", 0, 0)


@pytest.mark.parametrize("error", [NOT_SUPPORTED, NO_PERMISSION, LOST,
                                   pynvml.NVML_ERROR_UNKNOWN])
@pytest.mark.parametrize("call", TOPOLOGY_CALLS)
def test_a_link_nvml_cannot_read_is_unknown_and_discovery_goes_on(
        monkeypatch: pytest.MonkeyPatch, call: str, error: int) -> None:
    driver = FakeNvml(monkeypatch, MIXED)
    driver.fail(call, error)
    gpus = nvml.NvmlGpuBackend().discover()
    assert len(gpus) == 8
    links = links_by_index(gpus)
    if call == "nvmlDeviceGetTopologyCommonAncestor":
        assert links[(0, 5)] == Link(pcie=PciePath.UNKNOWN)
        assert links[(0, 3)].nvlinks == 2
    elif call == "nvmlDeviceGetP2PStatus" or (
            call == "nvmlDeviceGetNvLinkRemoteDeviceType" and error == NOT_SUPPORTED):
        assert links[(0, 3)].nvlinks == 2  # not asked here; a link without a type: by bus
    else:
        assert all(link.nvlinks == 0 for link in links.values())
        assert links[(0, 5)].pcie == PciePath.SYSTEM


def test_a_failed_peer_status_on_an_nvswitch_board_leaves_the_pair_without_nvlink(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeNvml(monkeypatch, NVSWITCH, switch=True)
    driver.fail("nvmlDeviceGetP2PStatus", NO_PERMISSION)
    links = links_by_index(nvml.NvmlGpuBackend().discover())
    assert links[(0, 1)].nvlinks == 0 and links[(0, 1)].pcie == PciePath.NUMA_NODE


@pytest.mark.parametrize("error", [NOT_SUPPORTED, NO_PERMISSION])
@pytest.mark.parametrize("call", HEALTH_CALLS)
def test_a_signal_the_gpu_does_not_have_is_not_watched_and_named(
        monkeypatch: pytest.MonkeyPatch, call: str, error: int) -> None:
    driver = FakeNvml(monkeypatch, MIXED)
    driver.fail(call, error)
    if call == "nvmlDeviceGetCurrentClocksEventReasons":
        driver.fail("nvmlDeviceGetCurrentClocksThrottleReasons", error)
    reading = nvmlhealth.read("h0", "GPU-0")
    assert not reading.lost and not reading.error
    why = "not supported" if error == NOT_SUPPORTED else "no permission"
    assert any(u.endswith(f"({why})") for u in reading.unsupported)
    assert reading.temperature_c is not None or call == "nvmlDeviceGetTemperature"


@pytest.mark.parametrize("call", [*HEALTH_CALLS, "nvmlDeviceGetMemoryInfo"])
def test_a_gpu_lost_on_any_health_call_is_unhealthy_as_fallen_off_the_bus(
        monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    driver = FakeNvml(monkeypatch, MIXED)
    backend = nvml.NvmlGpuBackend(health=HealthConfig(recover_after_s=0))
    driver.fail(call, LOST, gpu=2)
    changes: list[tuple] = []  # type: ignore[type-arg]
    backend._poll(changes.append)
    gpus = {g.index: g for g in backend.discover()}
    assert not gpus[2].healthy and "fallen off the bus" in gpus[2].reason
    assert all(g.healthy for i, g in gpus.items() if i != 2)
    assert {r.uuid: r.lost for r in backend.readings()}[gpus[2].uuid]
    driver.heal()
    backend._poll(changes.append)
    assert backend.discover()[2].healthy and len(changes) == 2


def test_an_older_driver_without_clock_event_reasons_is_asked_for_throttle_reasons(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeNvml(monkeypatch, MIXED)
    driver.entries[0]["telemetry"] = {"clockEvents": ["HwThermalSlowdown"]}
    driver.fail("nvmlDeviceGetCurrentClocksEventReasons", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    reading = nvmlhealth.read("h0", "GPU-0")
    assert reading.clock_event_names() == ["HwThermalSlowdown"] and not reading.unsupported


@pytest.mark.parametrize(("telemetry", "level", "words"), [
    ({}, Level.HEALTHY, ""),
    ({"eccVolatileUncorrected": 2}, Level.UNHEALTHY, "2 uncorrectable (double-bit) ECC"),
    ({"remappingFailed": True}, Level.UNHEALTHY, "row remapping failed"),
    ({"retiredPagesPending": True}, Level.DEGRADED, "retired memory page"),
    ({"remappedRowsPending": True}, Level.DEGRADED, "remapped memory row"),
    ({"eccVolatileCorrected": 1000}, Level.DEGRADED, "1000 correctable ECC"),
    ({"eccVolatileCorrected": 999}, Level.HEALTHY, ""),
    ({"clockEvents": ["HwThermalSlowdown"]}, Level.DEGRADED, "HwThermalSlowdown"),
    ({"clockEvents": ["SwThermalSlowdown"]}, Level.DEGRADED, "SwThermalSlowdown"),
    ({"clockEvents": ["HwPowerBrakeSlowdown"]}, Level.DEGRADED, "HwPowerBrakeSlowdown"),
    ({"clockEvents": ["HwSlowdown"]}, Level.DEGRADED, "HwSlowdown"),
    ({"clockEvents": ["SwPowerCap", "GpuIdle", "SyncBoost"]}, Level.HEALTHY, ""),
    ({"eccAggregateUncorrected": 5, "eccAggregateCorrected": 9000}, Level.HEALTHY, ""),
    ({"lost": True}, Level.UNHEALTHY, "fallen off the bus"),
], ids=lambda v: str(v) if not isinstance(v, dict) else ",".join(v) or "nothing")
def test_every_health_signal_read_through_nvml_maps_to_its_level(
        monkeypatch: pytest.MonkeyPatch, telemetry: dict, level: Level,  # type: ignore[type-arg]
        words: str) -> None:
    driver = FakeNvml(monkeypatch, MIXED)
    backend = nvml.NvmlGpuBackend(health=HealthConfig(recover_after_s=0))
    driver.entries[1]["telemetry"] = telemetry
    backend._poll(lambda gs: None)
    gpu = backend.discover()[1]
    assert gpu.level == level.spelling
    assert words in (gpu.reason or gpu.degraded)


def test_pcie_replays_degrade_a_gpu_by_their_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeNvml(monkeypatch, MIXED)
    clock = iter([0.0, 60.0, 120.0])
    backend = nvml.NvmlGpuBackend(health=HealthConfig(recover_after_s=0),
                                  clock=lambda: next(clock))
    for replays, level in ((100, "Healthy"), (105, "Healthy"), (200, "Degraded")):
        driver.entries[0]["telemetry"] = {"pcieReplays": replays}
        backend._poll(lambda gs: None)
        assert backend.discover()[0].level == level
