"""The controller's plan for remote GPU slices, as values: servers made where the decision
says, states and their Events, lost and failed servers, credentials renewed and revoked,
and nothing left once a pod is gone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpupool.contract.slices import SliceState, SliceStatus
from gpupool.controller.sliceserver import Served, ServerSettings
from gpupool.controller.slicesplan import (
    CreateObject,
    CredentialSeen,
    DeleteObject,
    Issue,
    Mark,
    RemotePod,
    ServerSeen,
    SlicePlan,
    Timing,
    plan,
)
from gpupool.core.allocation import Allocation, Slice
from gpupool.security.sessions import iso

SETTINGS = ServerSettings("stub", "gpupool-system", "reg.example/gpupool:1")
NAME = "0123456789abcdef"
NOW = 1_000_000.0
TIMING = Timing(lost_after_s=30, start_deadline_s=300, retry_s=120, lifetime_s=3600)


def served(node: str = "g1", gpu: str = "GPU-g1-0", uid: str = "u1",
           name: str = NAME) -> Served:
    alloc = Allocation(uid, "cpu1", 1000, 1024, (Slice(gpu, 0, 4096, 30, "main", 1024, 0),),
                       False, node)
    return Served(uid, "lab", "train", name, alloc)


def remote(status: SliceStatus | None = None, **kw: str) -> RemotePod:
    return RemotePod(served(**kw), status, 1.0)


def server(generation: int = 1, node: str = "g1", gpu: str = "GPU-g1-0", **kw: object
           ) -> ServerSeen:
    fields: dict[str, object] = {"phase": "Running", "ready": True, "changed_s": NOW - 5,
                                 "created_s": NOW - 60}
    fields.update(kw)
    return ServerSeen(f"gpupool-slice-{NAME}-{generation}", NAME, "u1", generation, node,
                      gpu, **fields)  # type: ignore[arg-type]


HELD = CredentialSeen(NAME, "u1", 0xA1, NOW + 3000, 0xB2, NOW + 3000)
SERVICE = {f"gpupool-slice-{NAME}": "u1"}


def run(pods: Sequence[RemotePod], servers: Sequence[ServerSeen] = (),
        services: dict[str, str] | None = None, credentials: Sequence[CredentialSeen] = (HELD,),
        settings: ServerSettings = SETTINGS, now: float = NOW) -> SlicePlan:
    return plan(pods, servers, SERVICE if services is None else services, credentials,
                {"GPU-g1-0": "mps", "GPU-g2-0": "none"}, settings, now, TIMING)


def marks(done: SlicePlan) -> list[SliceStatus]:
    return [a.status for a in done.actions if isinstance(a, Mark)]


def created(done: SlicePlan) -> list[dict[str, object]]:
    return [a.obj for a in done.actions if isinstance(a, CreateObject)]


def deleted(done: SlicePlan) -> list[str]:
    return [f"{a.kind}/{a.name}" for a in done.actions if isinstance(a, DeleteObject)]


def test_a_new_remote_slice_gets_its_service_credentials_and_a_server_on_the_decided_gpu() -> None:
    done = run([remote()], services={}, credentials=())
    kinds = [o["kind"] for o in created(done)]
    assert kinds == ["Service", "Pod"]
    pod = created(done)[1]
    spec = pod["spec"]  # type: ignore[index]
    assert spec["nodeName"] == "g1"
    args = spec["containers"][0]["args"]
    assert {"--pod-uid=u1", "--gpu-uuid=GPU-g1-0", "--memory-mib=5120", "--core-pct=30",
            "--container=main", "--isolation-provider=mps", "--provider=stub",
            "--mps-pipe-directory=/tmp/nvidia-mps"} <= set(args)
    assert spec["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES",
                                             "value": "GPU-g1-0"}]
    assert pod["metadata"]["name"] == f"gpupool-slice-{NAME}-1"  # type: ignore[index]
    assert [(a.client) for a in done.actions if isinstance(a, Issue)] == [False, True]
    assert marks(done) == [SliceStatus(SliceState.STARTING, "g1",
                                       f"gpupool-system/gpupool-slice-{NAME}-1",
                                       since=iso(NOW))]


def test_a_ready_server_makes_the_slice_serving_with_an_event_once() -> None:
    done = run([remote()], [server()])
    (mark,) = [a for a in done.actions if isinstance(a, Mark)]
    assert mark.status.state is SliceState.SERVING
    assert mark.event == ("GpupoolSliceServing", "its GPU slice is served by "
                          f"gpupool-system/gpupool-slice-{NAME}-1 on g1", False)
    again = run([remote(mark.status)], [server()])
    assert again.actions == [] and again.states == {"serving": 1}


def test_a_serving_server_silent_past_the_deadline_is_lost_then_waits_to_be_placed_again(
        ) -> None:
    serving = SliceStatus(SliceState.SERVING, "g1", "gpupool-system/x", since=iso(NOW - 99))
    quiet = server(ready=False, changed_s=NOW - 10)
    assert run([remote(serving)], [quiet]).actions == []  # within the deadline
    done = run([remote(serving)], [server(ready=False, changed_s=NOW - 45)])
    assert deleted(done) == [f"Pod/gpupool-slice-{NAME}-1"] and done.lost == 1
    (lost,) = marks(done)
    assert lost.state is SliceState.LOST
    assert lost.reason == "the slice server on g1 (GPU-g1-0) has not answered for 45 s"
    waiting = run([remote(lost)])  # the decision still names g1: no server there
    assert created(waiting) == []
    later = run([remote(lost)], now=NOW + 121)  # not placed elsewhere: served there again
    assert [o["kind"] for o in created(later)] == ["Pod"]


def test_a_decision_placed_again_moves_the_server_to_its_new_node() -> None:
    lost = SliceStatus(SliceState.LOST, "g1", "gpupool-system/x", "silent", iso(NOW))
    done = run([remote(lost, node="g2", gpu="GPU-g2-0")], [server(2, phase="Failed")])
    pods = created(done)
    assert pods[0]["spec"]["nodeName"] == "g2"  # type: ignore[index]
    assert pods[0]["metadata"]["name"] == f"gpupool-slice-{NAME}-3"  # type: ignore[index]
    assert "--isolation-provider=none" in pods[0]["spec"]["containers"][0]["args"]  # type: ignore[index]
    assert f"Pod/gpupool-slice-{NAME}-2" in deleted(done)
    assert marks(done)[0].state is SliceState.STARTING


def test_a_server_that_cannot_start_fails_with_its_reason() -> None:
    pending = server(phase="Pending", ready=False, changed_s=None, created_s=NOW - 301,
                     message="ErrImagePull: pull access denied")
    done = run([remote()], [pending])
    (failed,) = marks(done)
    assert failed.state is SliceState.FAILED
    assert failed.reason == ("the slice server on g1 (GPU-g1-0) did not become ready within "
                             "300 s: ErrImagePull: pull access denied")
    crashed = run([remote()], [server(phase="Failed", ready=False, message="Error: exit 2")])
    assert marks(crashed)[0].reason == "the slice server on g1 (GPU-g1-0) ended: Error: exit 2"


def test_a_server_that_released_its_slice_is_started_again_while_the_pod_lives() -> None:
    serving = SliceStatus(SliceState.SERVING, "g1", "gpupool-system/x", since=iso(NOW))
    done = run([remote(serving)], [server(phase="Succeeded", ready=False,
                                          message="Completed")])
    assert deleted(done) == [f"Pod/gpupool-slice-{NAME}-1"]
    assert marks(done)[0].reason == ("the previous server released the slice (Completed); a "
                                     "new one starts")


def test_everything_of_a_gone_pod_is_deleted_and_its_certificates_revoked() -> None:
    done = run([], [server()])
    assert sorted(deleted(done)) == [f"Pod/gpupool-slice-{NAME}-1",
                                     f"Secret/gpupool-slice-{NAME}-server",
                                     f"Service/gpupool-slice-{NAME}"]
    assert done.revoke == {0xA1: NOW + 3000, 0xB2: NOW + 3000}


def test_credentials_are_renewed_when_a_third_of_their_life_is_left() -> None:
    due = replace(HELD, expires_s=NOW + 1000, client_expires_s=NOW + 1000)
    done = run([remote()], [server()], credentials=[due])
    assert [a.client for a in done.actions if isinstance(a, Issue)] == [False, True]
    # the renewed ones stay valid until they expire: the sidecar's open channels keep
    # theirs (a revocation would close them within a heartbeat, before its new
    # certificate may even have reached it)
    assert done.revoke == {}
    moved = run([remote()], [server()], credentials=[replace(due, uid="u-before")])
    assert moved.revoke == {0xA1: NOW + 1000, 0xB2: NOW + 1000}  # another pod's: revoked
    fresh = run([remote()], [server()])
    assert not [a for a in fresh.actions if isinstance(a, Issue)]


def test_without_a_provider_or_a_slice_name_or_with_a_taken_one_nothing_is_served() -> None:
    none = run([remote()], settings=replace(SETTINGS, provider="none"))
    assert marks(none)[0].reason.startswith("remote GPU slices are not enabled on this cluster")
    unnamed = run([remote(name="")])
    assert marks(unnamed)[0].state is SliceState.UNSERVED
    assert "created without gpupool's admission webhook" in marks(unnamed)[0].reason
    first, copy = remote(), RemotePod(served(uid="u2"), None, 5.0)
    taken = run([copy, first], [server()])
    assert [(m.state, m.reason) for m in marks(taken)] == [
        (SliceState.UNSERVED, f"its slice name {NAME} is already used by pod lab/train"),
        (SliceState.SERVING, "")]


def test_the_server_and_sidecar_arguments_are_what_the_commands_accept() -> None:
    from gpupool.cli.main import build_parser
    from gpupool.webhook.remote import RemoteSettings, sidecar

    parser = build_parser()
    pod = created(run([remote()], services={}, credentials=()))[1]
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    args = parser.parse_args(container["command"][1:] + container["args"])
    assert (args.gpu_uuid, args.memory_mib, args.core_pct, args.isolation_provider) == (
        "GPU-g1-0", 5120, 30, "mps")
    lupine = replace(SETTINGS, provider="lupine", provider_command="/opt/lupine/server {port}",
                     provider_env=("SCUDA_PORT={port}",))
    pod = created(run([remote()], services={}, credentials=(), settings=lupine))[1]
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    args = parser.parse_args(container["command"][1:] + container["args"])
    assert (args.provider, args.provider_command, args.allow_exposed_provider) == (
        "command", "/opt/lupine/server {port}", True)
    side = sidecar(RemoteSettings("stub", "gpupool-slices", "img"), NAME)
    words = [a.replace("$(GPUPOOL_POD_UID)", "u1") for a in side["args"]]
    client = parser.parse_args(side["command"][1:] + words)
    assert client.slice_server == (f"gpupool-slice-{NAME}.gpupool-slices.svc", 14900)
    assert (client.pod_uid, client.port, client.status_port) == ("u1", 14833, 14834)


def test_a_secret_of_another_pod_is_issued_anew_for_the_live_pod_not_deleted() -> None:
    """Its serials are revoked; the Secret itself now carries the live pod's certificates
    (deleting it in the same round left the new server nothing to mount)."""
    done = run([remote()], [server()], credentials=[replace(HELD, uid="u-before")])
    assert DeleteObject("Secret", f"gpupool-slice-{NAME}-server") not in done.actions
    assert [a.client for a in done.actions if isinstance(a, Issue)] == [False, True]
    assert HELD.serial in done.revoke
