"""The DRA plugin over real unix sockets, driven by the FAKE kubelet built from the same
protos: registration, prepare (one claim, a GPU shared by two claims, whole GPUs,
repeated), unprepare, refusals, restart with the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import dra
from gpupool.nodeagent.exposure import Exposure, Strategy

from ..builders import NODE, uuid_of, wait_for
from .builders import NAMESPACE, allocated_claim, claim_pod, ref
from .conftest import DraFactory
from .kubelet_dra import FakeDraKubelet, container_edits


def seed(apiserver: FakeApiServer, claim: dict[str, Any], *pods: dict[str, Any]
         ) -> tuple[str, str, str]:
    apiserver.seed("resourceclaims", claim)
    for p in pods:
        apiserver.seed("pods", p)
    return ref(claim)


def test_kubelet_registers_the_driver_and_chooses_v1(make_dra: DraFactory,
                                                     dra_kubelet: FakeDraKubelet) -> None:
    agent = make_dra()
    info = dra_kubelet.discover()
    assert (info.type, info.name) == ("DRAPlugin", dra.DRIVER)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert info.endpoint == str(agent.config.dra_socket) and Path(info.endpoint).is_socket()
    assert dra_kubelet.service == "v1.DRAPlugin"
    assert agent.registration.registered.wait(30)


def test_a_kubelet_that_refuses_is_remembered(make_dra: DraFactory,
                                               dra_kubelet: FakeDraKubelet) -> None:
    agent = make_dra()
    dra_kubelet.discover(accept=False)
    wait_for(lambda: agent.registration.notifications == 1)
    assert not agent.registration.registered.is_set()
    assert agent.registration.error == "refused by test"


def test_one_shared_claim_is_prepared_with_its_slice_in_a_cdi_spec(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    make_dra()
    dra_kubelet.discover()
    claim = seed(apiserver, allocated_claim("a", ["gpu-1"], memory="4Gi", cores="30",
                                            pods=("pa",)), claim_pod("pa", "a"))
    answer = dra_kubelet.prepare(claim)["uid-a"]
    assert answer.error == ""
    assert answer.devices == [(("gpu",), NODE, "gpu-1", ("gpu.gpupool.io/claim=uid-a",))]
    env, mounts, foreign = container_edits(short_dir / "cdi", answer.cdi_ids,
                                           {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert foreign == []
    assert env["GPUPOOL_GPU_UUIDS"] == uuid_of(1)
    assert (env["GPUPOOL_GPU_MEMORY_MIB"], env["GPUPOOL_GPU_CORE_PCT"]) == ("4096", "30")
    assert env["GPUPOOL_MODE"] == "shared" and env["GPUPOOL_CLAIM"] == f"{NAMESPACE}/a"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"  # the none provider's
    # the pod's own NVIDIA_VISIBLE_DEVICES=all is replaced: only the mounted GPU is named
    assert env["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert [m["containerPath"] for m in mounts] == [
        f"/var/run/nvidia-container-devices/{uuid_of(1)}"]
    assert mounts[0]["hostPath"] == "/dev/null" and "ro" in mounts[0]["options"]


def test_two_claims_share_one_gpu_each_with_its_own_limits(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = make_dra()
    dra_kubelet.discover()
    a = seed(apiserver, allocated_claim("a", ["gpu-0"], memory="10Gi", cores="30"))
    b = seed(apiserver, allocated_claim("b", ["gpu-0"], memory="4Gi", cores="50"))
    answers = dra_kubelet.prepare(a, b)
    assert {u: r.error for u, r in answers.items()} == {"uid-a": "", "uid-b": ""}
    limits = [container_edits(short_dir / "cdi", answers[u].cdi_ids, {})[0][
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for u in ("uid-a", "uid-b")]
    assert limits == ["30", "50"]
    assert agent.preparer.held() == {uuid_of(0): (14336, 80)}


def test_a_claim_that_does_not_fit_next_to_the_prepared_ones_is_refused(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer) -> None:
    make_dra(memory_mib=16384)
    dra_kubelet.discover()
    a = seed(apiserver, allocated_claim("a", ["gpu-0"], memory="12Gi", cores="30"))
    b = seed(apiserver, allocated_claim("b", ["gpu-0"], memory="8Gi", cores="30"))
    assert dra_kubelet.prepare(a)["uid-a"].error == ""
    error = dra_kubelet.prepare(b)["uid-b"].error
    assert "cannot serve this allocation" in error and "4096 MiB" in error


def test_a_whole_gpu_claim_is_exclusive_and_takes_no_limits(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = make_dra()
    dra_kubelet.discover()
    whole = seed(apiserver, allocated_claim("w", ["gpu-0", "gpu-1"]))
    answer = dra_kubelet.prepare(whole)["uid-w"]
    assert answer.error == "" and [d[2] for d in answer.devices] == ["gpu-0", "gpu-1"]
    env, mounts, _ = container_edits(short_dir / "cdi", answer.cdi_ids, {})
    assert env["GPUPOOL_MODE"] == "exclusive"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    assert len(mounts) == 2
    assert agent.preparer.held() == {uuid_of(0): (16384, 100), uuid_of(1): (16384, 100)}
    shared = seed(apiserver, allocated_claim("s", ["gpu-1"], memory="1Gi", cores="1"))
    assert "cannot serve" in dra_kubelet.prepare(shared)["uid-s"].error


def test_preparing_again_answers_the_same_and_reserves_nothing_more(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = make_dra()
    dra_kubelet.discover()
    a = seed(apiserver, allocated_claim("a", ["gpu-0"], memory="8Gi", cores="60"))
    first = dra_kubelet.prepare(a)["uid-a"]
    (short_dir / "cdi" / "gpu.gpupool.io-claim_uid-a.json").unlink()  # a runtime lost it
    again = dra_kubelet.prepare(a)["uid-a"]
    assert again == first and again.error == ""
    assert (short_dir / "cdi" / "gpu.gpupool.io-claim_uid-a.json").is_file()
    assert agent.preparer.held() == {uuid_of(0): (8192, 60)}


def test_unprepare_removes_the_spec_and_frees_the_gpu_and_is_harmless_twice(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = make_dra()
    dra_kubelet.discover()
    a = seed(apiserver, allocated_claim("a", ["gpu-0"], memory="16Gi", cores="100"))
    assert dra_kubelet.prepare(a)["uid-a"].error == ""
    assert dra_kubelet.unprepare(a) == {"uid-a": ""}
    assert dra_kubelet.unprepare(a) == {"uid-a": ""}
    assert list((short_dir / "cdi").glob("*.json")) == []
    assert agent.preparer.held() == {}
    b = seed(apiserver, allocated_claim("b", ["gpu-0"], memory="16Gi", cores="100"))
    assert dra_kubelet.prepare(b)["uid-b"].error == ""


def test_a_restarted_plugin_keeps_its_claims_and_does_not_prepare_them_twice(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    first = make_dra()
    dra_kubelet.discover()
    a = seed(apiserver, allocated_claim("a", ["gpu-0"], memory="10Gi", cores="40"))
    before = dra_kubelet.prepare(a)["uid-a"]
    first.stop()
    (short_dir / "cdi" / "gpu.gpupool.io-claim_uid-a.json").unlink()  # /var/run is a tmpfs
    (short_dir / "cdi" / "gpu.gpupool.io-claim_uid-gone.json").write_text("{}")
    second = make_dra(write=False)
    assert second.preparer.held() == {uuid_of(0): (10240, 40)}
    assert sorted(p.name for p in (short_dir / "cdi").glob("*.json")) == [
        "gpu.gpupool.io-claim_uid-a.json"]
    dra_kubelet.discover()
    assert dra_kubelet.prepare(a)["uid-a"] == before
    b = seed(apiserver, allocated_claim("b", ["gpu-0"], memory="8Gi", cores="10"))
    assert "cannot serve" in dra_kubelet.prepare(b)["uid-b"].error
    saved = [p.name for p in (short_dir / "state" / "dra" / "claims").iterdir()]
    assert saved == ["uid-a.json"]


def test_the_v1beta1_service_prepares_the_same_way(make_dra: DraFactory,
                                                   apiserver: FakeApiServer,
                                                   short_dir: Path) -> None:
    make_dra()
    old = FakeDraKubelet(short_dir / "kubelet", services=["v1beta1.DRAPlugin"])
    old.discover()
    assert old.service == "v1beta1.DRAPlugin"
    a = seed(apiserver, allocated_claim("a", ["gpu-1"], memory="1Gi", cores="5"))
    assert old.prepare(a)["uid-a"].devices[0][2] == "gpu-1"
    assert old.unprepare(a) == {"uid-a": ""}
    old.close()


@pytest.mark.parametrize(("claim", "expected"), [
    (allocated_claim("x", ["gpu-0"], memory="1Gi", cores="1", node="node-b"),
     "pool(s) ['node-b'], not of node node-a"),
    (allocated_claim("x", ["gpu-9"], memory="1Gi", cores="1"), "gpu-9 is not published"),
    ({**allocated_claim("x", ["gpu-0"]), "status": {}}, "holds no gpu.gpupool.io device"),
    (allocated_claim("x", ["gpu-0"], memory="1Gi", cores="1", uid="uid-other"),
     "is another object now"),
])
def test_claims_the_node_cannot_serve_are_refused_with_the_reason(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        claim: dict[str, Any], expected: str) -> None:
    agent = make_dra()
    dra_kubelet.discover()
    apiserver.seed("resourceclaims", claim)
    error = dra_kubelet.prepare((NAMESPACE, "x", "uid-x"))["uid-x"].error
    assert expected in error and f"{NAMESPACE}/x" in error
    assert agent.preparer.held() == {}


def test_a_claim_that_is_gone_is_refused(make_dra: DraFactory,
                                         dra_kubelet: FakeDraKubelet) -> None:
    make_dra()
    dra_kubelet.discover()
    assert "does not exist" in dra_kubelet.prepare((NAMESPACE, "nope", "uid-n"))["uid-n"].error


def test_a_pod_that_sets_its_own_gpu_variables_is_refused_as_on_the_device_plugin_path(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    make_dra()
    dra_kubelet.discover()
    a = seed(apiserver, allocated_claim("a", ["gpu-0"], memory="1Gi", cores="10", pods=("pa",)),
             claim_pod("pa", "a", env={"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}))
    error = dra_kubelet.prepare(a)["uid-a"].error
    assert "pod team-a/pa" in error and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in error
    assert list((short_dir / "cdi").glob("*.json")) == []


def test_an_unhealthy_gpu_takes_no_new_claim(make_dra: DraFactory, dra_kubelet: FakeDraKubelet,
                                             apiserver: FakeApiServer) -> None:
    agent = make_dra()
    dra_kubelet.discover()
    agent.backend.set_health(uuid_of(0), False, "XID 79")  # type: ignore[attr-defined]
    wait_for(lambda: not agent.known_gpus()[0].healthy)
    a = seed(apiserver, allocated_claim("a", ["gpu-0"], memory="1Gi", cores="1"))
    assert "is unhealthy" in dra_kubelet.prepare(a)["uid-a"].error


def test_with_the_cdi_strategy_each_device_also_names_the_gpus_cdi_device(
        make_dra: DraFactory, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    make_dra(exposure=Exposure(Strategy.CDI))
    dra_kubelet.discover()
    a = seed(apiserver, allocated_claim("a", ["gpu-0", "gpu-1"]))
    answer = dra_kubelet.prepare(a)["uid-a"]
    assert [d[3] for d in answer.devices] == [
        ("gpu.gpupool.io/claim=uid-a", f"nvidia.com/gpu={uuid_of(0)}"),
        (f"nvidia.com/gpu={uuid_of(1)}",)]
    env, mounts, foreign = container_edits(short_dir / "cdi", answer.cdi_ids,
                                           {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and mounts == []
    assert foreign == [f"nvidia.com/gpu={uuid_of(0)}", f"nvidia.com/gpu={uuid_of(1)}"]


def test_sockets_kubelet_removed_are_served_again(make_dra: DraFactory,
                                                  dra_kubelet: FakeDraKubelet,
                                                  apiserver: FakeApiServer) -> None:
    agent = make_dra()
    dra_kubelet.discover()
    agent.config.registration_socket.unlink()
    agent.config.dra_socket.unlink()
    wait_for(lambda: agent.reg_server.healthy() and agent.dra_server.healthy())
    dra_kubelet.discover()
    a = seed(apiserver, allocated_claim("a", ["gpu-0"], memory="1Gi", cores="1"))
    assert dra_kubelet.prepare(a)["uid-a"].error == ""
