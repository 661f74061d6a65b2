"""MIG through NVML, against a FAKE libnvidia-ml: listing, making and destroying MIG
devices, and every NVML error the node agent meets there."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pynvml
import pytest

from gpupool.core.mig import MigDevice, MigMode
from gpupool.nodeagent import nvml, nvmlmig
from gpupool.nodeagent.mig import MigError

from .fake_nvml import FakeNvml
from .fake_nvml_mig import FakeGpu, FakeMigNvml, Instance

GPU = "GPU-aaaa0000-0000-0000-0000-000000000000"
BOARDS = Path(__file__).resolve().parents[2] / "examples" / "boards"


def one_gpu(monkeypatch: pytest.MonkeyPatch, **instances: Instance) -> FakeMigNvml:
    gpu = FakeGpu(GPU, instances={int(k[2:]): v for k, v in instances.items()})
    return FakeMigNvml(monkeypatch, [gpu])


def test_every_pynvml_name_the_mig_code_uses_exists_in_nvidia_ml_py() -> None:
    tree = ast.parse(inspect.getsource(nvmlmig))
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "pynvml"}
    assert {"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceProfileInfo",
            "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy"} <= used
    assert sorted(name for name in used if not hasattr(pynvml, name)) == []


def test_a_gpu_in_mig_mode_lists_its_devices_with_profile_placement_and_ids(
        monkeypatch: pytest.MonkeyPatch) -> None:
    one_gpu(monkeypatch, gi1=Instance(9, 4), gi2=Instance(19, 0), gi3=Instance(15, 2))
    mode = nvmlmig.read("h0", GPU)
    assert isinstance(mode, MigMode)
    got = [(i.uuid, i.memory_mib, i.sm_count, i.device) for i in mode.instances]
    assert got == [
        ("MIG-aaaa0000-0000-0000-0000-000000000000-1", 39424, 42,
         MigDevice(GPU, "3g.40gb", 4, 4, 3, 1, 0)),
        ("MIG-aaaa0000-0000-0000-0000-000000000000-2", 9856, 14,
         MigDevice(GPU, "1g.10gb", 0, 1, 1, 2, 0)),
        ("MIG-aaaa0000-0000-0000-0000-000000000000-3", 19712, 14,
         MigDevice(GPU, "1g.20gb", 2, 2, 1, 3, 0))]


def test_devices_gpupool_cannot_serve_whole_are_left_out(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    one_gpu(monkeypatch, gi1=Instance(20, 0), gi2=Instance(9, 4, ci_slices=1),
            gi3=Instance(19, 1))
    mode = nvmlmig.read("h0", GPU)
    assert mode is not None and [i.device.profile for i in mode.instances] == ["1g.10gb"]
    assert "not one gpupool serves" in caplog.text and "spans 1 of its GPU" in caplog.text


@pytest.mark.parametrize(("error", "ordinary"), [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, True), (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, True),
    (pynvml.NVML_ERROR_NO_PERMISSION, False), (pynvml.NVML_ERROR_GPU_IS_LOST, False),
], ids=["not supported", "old driver", "no permission", "GPU lost"])
def test_a_mig_mode_nvml_cannot_tell_hands_out_nothing_of_the_gpu(
        monkeypatch: pytest.MonkeyPatch, error: int, ordinary: bool) -> None:
    fake = one_gpu(monkeypatch)
    fake.fail("nvmlDeviceGetMigMode", error)
    assert nvmlmig.read("h0", GPU) == (None if ordinary else MigMode())


@pytest.mark.parametrize("function", ["nvmlDeviceGetMaxMigDeviceCount",
                                      "nvmlDeviceGetAttributes", "nvmlGpuInstanceGetInfo"])
@pytest.mark.parametrize("error", [pynvml.NVML_ERROR_NO_PERMISSION,
                                   pynvml.NVML_ERROR_GPU_IS_LOST])
def test_devices_that_cannot_be_listed_are_not_handed_out(
        monkeypatch: pytest.MonkeyPatch, function: str, error: int) -> None:
    fake = one_gpu(monkeypatch, gi1=Instance(0, 0))
    fake.fail(function, error)
    assert nvmlmig.read("h0", GPU) == MigMode()


def test_mig_disabled_or_pending_a_reset_is_an_ordinary_gpu(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    fake = FakeMigNvml(monkeypatch, [FakeGpu(GPU, (0, 0)), FakeGpu(GPU[:-1] + "1", (0, 1))])
    assert nvmlmig.read("h0", GPU) is None and nvmlmig.read("h1", GPU) is None
    assert "nvmlDeviceGetMaxMigDeviceCount" not in fake.names


def test_the_driver_makes_a_device_at_its_placement_with_a_spanning_compute_instance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = one_gpu(monkeypatch, gi1=Instance(5, 0))
    nvmlmig.NvmlMigDriver(lambda: ()).create(GPU, "3g.40gb", 4)
    made = fake.gpus[0].instances[2]
    assert (made.profile_id, made.start, made.ci) == (9, 4, 0)
    ((_, (_, p, engine)),) = [c for c in fake.calls
                              if c[0] == "nvmlGpuInstanceGetComputeInstanceProfileInfo"]
    assert (p, engine) == (pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
                           pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)


def test_a_failed_compute_instance_takes_its_gpu_instance_back(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    fake = one_gpu(monkeypatch)
    fake.fail("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    with pytest.raises(MigError, match=r"create the compute instance of 1g\.10gb"):
        nvmlmig.NvmlMigDriver(lambda: ()).create(GPU, "1g.10gb", 3)
    assert fake.gpus[0].instances == {}


@pytest.mark.parametrize(("error", "says"), [
    (pynvml.NVML_ERROR_NO_PERMISSION, "lacks the privilege to change MIG devices"),
    (pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, "the placement is taken"),
    (pynvml.NVML_ERROR_GPU_IS_LOST, "the GPU is lost"),
    (pynvml.NVML_ERROR_NOT_SUPPORTED, "does not support it"),
], ids=["no permission", "taken", "GPU lost", "not supported"])
def test_nvml_refusals_to_make_a_device_say_why(monkeypatch: pytest.MonkeyPatch, error: int,
                                                says: str) -> None:
    fake = one_gpu(monkeypatch)
    fake.fail("nvmlDeviceCreateGpuInstanceWithPlacement", error)
    with pytest.raises(MigError, match=r"cannot create a 7g\.80gb GPU instance at memory "
                                       r"slice 0") as err:
        nvmlmig.NvmlMigDriver(lambda: ()).create(GPU, "7g.80gb", 0)
    assert says in str(err.value)


def test_a_taken_placement_and_an_unknown_profile_are_refused(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    one_gpu(monkeypatch, gi1=Instance(5, 0))
    driver = nvmlmig.NvmlMigDriver(lambda: ())
    with pytest.raises(MigError, match="the placement is taken"):
        driver.create(GPU, "1g.10gb", 2)
    with pytest.raises(MigError, match=r"offers no MIG profile 1g\.5gb"):
        driver.create(GPU, "1g.5gb", 6)


def test_the_driver_destroys_compute_then_gpu_instance_and_not_one_in_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = one_gpu(monkeypatch, gi1=Instance(9, 0), gi2=Instance(9, 4, processes=[4242]))
    driver = nvmlmig.NvmlMigDriver(lambda: ())
    driver.destroy(GPU, MigDevice(GPU, "3g.40gb", 0, 4, 3, 1, 0))
    assert sorted(fake.gpus[0].instances) == [2]
    order = [n for n, _ in fake.calls if n in ("nvmlComputeInstanceDestroy",
                                               "nvmlGpuInstanceDestroy")]
    assert order == ["nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"]
    assert driver.processes(f"MIG-{GPU[4:]}-2") == ["process 4242"]
    with pytest.raises(MigError, match="a process still uses the device"):
        driver.destroy(GPU, MigDevice(GPU, "3g.40gb", 4, 4, 3, 2, 0))


def test_unreadable_processes_count_as_a_client(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = one_gpu(monkeypatch, gi1=Instance(0, 0))
    fake.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION)
    (said,) = nvmlmig.NvmlMigDriver(lambda: ()).processes(f"MIG-{GPU[4:]}-1")
    assert said.startswith("processes not readable")


def test_the_nvml_backend_discovers_mig_devices_and_reads_them_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch, BOARDS / "mixed-dgx1-v100.yaml")
    board = pynvml.nvmlDeviceGetUUID("h0").decode()
    fake = FakeMigNvml(monkeypatch, [FakeGpu(board, instances={1: Instance(0, 0)})])
    backend = nvml.NvmlGpuBackend(poll_s=0.01)
    first = backend.discover()
    assert isinstance(first[0].mig, MigMode) and len(first[0].mig.instances) == 1
    assert all(g.mig is None for g in first[1:])  # the fake answers NOT_SUPPORTED for them
    fake.gpus[0].instances = {1: Instance(9, 0), 2: Instance(9, 4)}
    again = backend.rescan_mig()
    assert isinstance(again[0].mig, MigMode)
    assert [i.device.describe() for i in again[0].mig.instances] == ["3g.40gb@0", "3g.40gb@4"]


def test_a_start_nvml_does_not_list_for_the_profile_is_refused(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    fake = one_gpu(monkeypatch)
    with pytest.raises(MigError, match=r"2g.20gb cannot start at memory slice 6 .*NVML allows "
                                       r"0, 2, 4\)"):
        nvmlmig.NvmlMigDriver(lambda: ()).create(GPU, "2g.20gb", 6)
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in fake.names
