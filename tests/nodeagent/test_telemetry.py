"""Health and telemetry through the FAKE GPU backend: every mapping, the recovery rule, the
per-GPU metrics (names apart from DCGM's), and the agent publishing them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.health import HealthConfig
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.telemetry import TelemetryMetrics

from .builders import uuid_of
from .conftest import AgentFactory

BOARD = Path(__file__).resolve().parents[2] / "examples" / "boards" / "nvswitch-8x-h100.yaml"


@pytest.fixture
def board(tmp_path: Path) -> Path:
    return Path(shutil.copy(BOARD, tmp_path / "gpus.yaml"))


@pytest.mark.parametrize(("telemetry", "level"), [
    ({"temperatureC": 90, "powerW": 650.5}, "Healthy"),
    ({"eccVolatileUncorrected": 1}, "Unhealthy"),
    ({"remappingFailed": True}, "Unhealthy"),
    ({"lost": True}, "Unhealthy"),
    ({"retiredPagesPending": True}, "Degraded"),
    ({"remappedRowsPending": True}, "Degraded"),
    ({"eccVolatileCorrected": 5000}, "Degraded"),
    ({"clockEvents": ["HwThermalSlowdown", "SwPowerCap"]}, "Degraded"),
    ({"clockEvents": ["SwPowerCap"]}, "Healthy"),
    ({"eccAggregateUncorrected": 3}, "Healthy"),
], ids=lambda v: ",".join(v) if isinstance(v, dict) else v)
def test_a_fake_gpus_telemetry_is_judged_by_the_health_table(
        board: Path, telemetry: dict, level: str) -> None:  # type: ignore[type-arg]
    backend = FakeGpuBackend(board)
    uuid = backend.discover()[3].uuid
    backend.set_telemetry(uuid, **telemetry)
    gpu = FakeGpuBackend(board).discover()[3]  # as a restarted agent reads the file
    assert gpu.level == level and gpu.healthy == (level != "Unhealthy")


def test_a_gpu_recovers_only_after_the_cause_has_been_quiet_for_recover_after(
        board: Path) -> None:
    now = [0.0]
    backend = FakeGpuBackend(board, health=HealthConfig(recover_after_s=60),
                             clock=lambda: now[0])
    uuid = backend.discover()[0].uuid
    backend.set_telemetry(uuid, clockEvents=["HwThermalSlowdown"])
    assert backend.discover()[0].level == "Degraded"
    now[0] = 10.0
    assert backend.discover()[0].level == "Degraded"  # still hot at 10 s
    backend.set_telemetry(uuid)  # cooled down
    now[0] = 69.0
    assert backend.discover()[0].level == "Degraded"  # 59 s quiet
    now[0] = 70.0
    assert backend.discover()[0].level == "Healthy"
    backend.set_health(uuid, False, "XID 79")  # an injected fault wins over telemetry
    gpu = backend.discover()[0]
    assert (gpu.level, gpu.reason) == ("Unhealthy", "XID 79")


def test_every_telemetry_metric_is_set_and_none_is_named_like_dcgms(board: Path) -> None:
    backend = FakeGpuBackend(board)
    uuid = backend.discover()[1].uuid
    backend.set_telemetry(uuid, temperatureC=71, powerW=402.5, fanPct=40,
                          clocksMHz={"graphics": 1755, "sm": 1755, "memory": 2619},
                          eccVolatileCorrected=2, eccAggregateUncorrected=1, pcieReplays=3,
                          retiredPagesPending=False, clockEvents=["SwPowerCap"],
                          unsupported=["fan (not supported)"])
    registry = CollectorRegistry()
    TelemetryMetrics(registry).export(backend.discover(), backend.readings())
    text = generate_latest(registry).decode()
    for line in (
            f'gpupool_node_gpu_temperature_celsius{{gpu="{uuid}"}} 71.0',
            f'gpupool_node_gpu_power_watts{{gpu="{uuid}"}} 402.5',
            f'gpupool_node_gpu_power_limit_watts{{gpu="{uuid}"}} 700.0',
            f'gpupool_node_gpu_clock_mhz{{clock="sm",gpu="{uuid}"}} 1755.0',
            f'gpupool_node_gpu_fan_speed_pct{{gpu="{uuid}"}} 40.0',
            f'gpupool_node_gpu_ecc_errors{{counter="volatile",gpu="{uuid}",type="corrected"}} '
            '2.0',
            f'gpupool_node_gpu_ecc_errors{{counter="aggregate",gpu="{uuid}",type="uncorrected"}}'
            ' 1.0',
            f'gpupool_node_gpu_pcie_replays{{gpu="{uuid}"}} 3.0',
            f'gpupool_node_gpu_retired_pages_pending{{gpu="{uuid}"}} 0.0',
            f'gpupool_node_gpu_clock_event{{gpu="{uuid}",reason="SwPowerCap"}} 1.0',
            f'gpupool_node_gpu_clock_event{{gpu="{uuid}",reason="HwThermalSlowdown"}} 0.0',
            f'gpupool_node_gpu_health_level{{gpu="{uuid}"}} 0.0'):
        assert line in text, line
    other = backend.discover()[2].uuid  # reports nothing: no series but its level
    assert f'gpupool_node_gpu_temperature_celsius{{gpu="{other}"}}' not in text
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line and not line.startswith("#")}
    assert names and all(n.startswith("gpupool_node_gpu_") for n in names)
    assert not any("DCGM" in n.upper() for n in names)


def test_the_agent_exports_the_telemetry_of_its_gpus(make_agent: AgentFactory) -> None:
    metrics = NodeMetrics()
    agent = make_agent(gpus=2, metrics=metrics)
    backend = agent.backend
    assert isinstance(backend, FakeGpuBackend)
    backend.set_telemetry(uuid_of(1), temperatureC=80, eccVolatileUncorrected=1)
    agent.check_once()
    text = generate_latest(metrics.registry).decode()
    assert f'gpupool_node_gpu_temperature_celsius{{gpu="{uuid_of(1)}"}} 80.0' in text
    assert f'gpupool_node_gpu_health_level{{gpu="{uuid_of(1)}"}} 2.0' in text
    assert f'gpupool_node_gpu_healthy{{gpu="{uuid_of(1)}"}} 0.0' in text
