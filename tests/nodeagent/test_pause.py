"""An over-user isolated as a workload: its container frozen (cgroup v2 freezer) while it
over-uses, the rest of the GPU serving on, and thawed when it is back within its slice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.nodeagent.actions import Actions, OveruseAction
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.freezer import FreezeFailed, Freezer
from gpupool.nodeagent.overuse import Changes, Observation, OverUse, OveruseConfig

from .builders import (
    cgroup_v2,
    container_id,
    pod_uid,
    uuid_of,
    wait_for,
    write_cgroup,
)
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet
from .test_monitor import CID, PID, UID, events, ready, served

SCOPE = ("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
         "cri-containerd-{c}.scope")


def container_cgroup(root: Path, uid: str, cid: str) -> Path:
    path = root / SCOPE.format(u=uid.replace("-", "_"), c=cid)
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.freeze").write_text("0")
    return path


def test_a_processs_container_cgroup_is_found_under_the_hosts_hierarchy(tmp_path: Path
                                                                         ) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    write_cgroup(proc, 7, "0::/../../" + SCOPE.format(u="x_y", c="c1") + "\n")
    freezer = Freezer(proc, root)
    assert freezer.cgroup_of(7) == root / SCOPE.format(u="x_y", c="c1")
    (root / SCOPE.format(u="x_y", c="c1")).mkdir(parents=True)
    freezer.set(freezer.cgroup_of(7), True)
    assert (root / SCOPE.format(u="x_y", c="c1") / "cgroup.freeze").read_text() == "1"


@pytest.mark.parametrize(("text", "words"), [
    ("12:freezer:/kubepods/besteffort/podx/c1\n", "needs cgroup v2"),
    ("0::/system.slice/sshd.service\n", "not in a pod's cgroup"),
    (None, "cannot read"),
])
def test_a_container_that_cannot_be_frozen_says_why(tmp_path: Path, text: str | None,
                                                     words: str) -> None:
    if text is not None:
        write_cgroup(tmp_path / "proc", 7, text)
    with pytest.raises(FreezeFailed, match=words):
        Freezer(tmp_path / "proc", tmp_path / "cgroup").cgroup_of(7)
    with pytest.raises(FreezeFailed, match="does not exist"):
        Freezer(tmp_path / "proc", tmp_path / "cgroup").set(tmp_path / "gone", True)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def pod_event(self, pod: Any, reason: str, message: str, warning: bool = True) -> None:
        self.events.append((reason, message))


class NoPods:
    def patch_annotations(self, pod: Any, annotations: Any) -> Any:
        return pod


def over(gpu: str, pids: tuple[int, ...] = (PID,)) -> OverUse:
    seen = Observation(UID, "default/p1", "main", gpu, 100, 90, 4096, 30, pids=pids)
    return OverUse(seen, 90, 0.0)


def test_pause_freezes_the_container_once_and_thaws_it_when_every_over_use_ended(
        tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    write_cgroup(proc, PID, cgroup_v2(UID, CID))
    cgroup = container_cgroup(root, UID, CID)
    recorder = Recorder()
    actions = Actions(OveruseAction.PAUSE, NoPods(), recorder,  # type: ignore[arg-type]
                      freezer=Freezer(proc, root))
    pod: Any = type("P", (), {"uid": UID, "ref": "default/p1", "annotations": {}})()
    a, b = over("g0"), over("g1")
    actions(Changes((a, b), (), (a, b)), {UID: pod})
    assert (cgroup / "cgroup.freeze").read_text() == "1" and actions.paused() == {cgroup}
    assert [r for r, _ in recorder.events].count("GpupoolPaused") == 1
    actions(Changes((), (a,), (b,)), {UID: pod})  # still over on g1: stays frozen
    assert (cgroup / "cgroup.freeze").read_text() == "1"
    actions(Changes((), (b,), ()), {UID: pod})
    assert (cgroup / "cgroup.freeze").read_text() == "0" and actions.paused() == set()
    assert recorder.events[-1][0] == "GpupoolResumed"


def test_a_container_that_cannot_be_frozen_is_reported_and_nothing_else(tmp_path: Path
                                                                        ) -> None:
    proc = tmp_path / "proc"
    write_cgroup(proc, PID, cgroup_v2(UID, CID))  # no cgroup directory under the root
    recorder = Recorder()
    actions = Actions(OveruseAction.PAUSE, NoPods(), recorder,  # type: ignore[arg-type]
                      freezer=Freezer(proc, tmp_path / "cgroup"))
    pod: Any = type("P", (), {"uid": UID, "ref": "default/p1", "annotations": {}})()
    a = over("g0")
    actions(Changes((a,), (), (a,)), {UID: pod})
    assert actions.paused() == set()
    assert any("pausing the container failed" in m for _, m in recorder.events)


def test_the_agent_pauses_an_over_user_and_resumes_it_when_it_is_within_its_slice_again(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    root = short_dir / "cgroup"
    cgroup = container_cgroup(root, UID, CID)
    other = container_cgroup(root, pod_uid(2), container_id(2))
    agent = make_agent(gpus=1, split=4, monitor_s=0.1, proc_root=short_dir / "proc",
                       action=OveruseAction.PAUSE, freezer=Freezer(short_dir / "proc", root),
                       overuse=OveruseConfig(grace_s=0.3, compute_window_s=0.5))
    ready(kubelet, 4)
    served(kubelet, apiserver, agent)
    write_cgroup(short_dir / "proc", PID, cgroup_v2(UID, CID))
    backend: FakeGpuBackend = agent.backend  # type: ignore[assignment]
    backend.set_processes(uuid_of(0), [(PID, 1000, 95)])  # 95 % of the compute, slice 30 %
    wait_for(lambda: (cgroup / "cgroup.freeze").read_text() == "1")
    wait_for(lambda: events(apiserver, "GpupoolPaused"))
    assert "% of the GPU's compute (slice 30 %)" in events(apiserver, "GpupoolPaused")[0]
    assert (other / "cgroup.freeze").read_text() == "0"  # the rest of the GPU serves on
    backend.set_processes(uuid_of(0), [(PID, 1000, 0)])  # frozen: no compute used
    wait_for(lambda: (cgroup / "cgroup.freeze").read_text() == "0")
    wait_for(lambda: events(apiserver, "GpupoolResumed"))
    backend.set_processes(uuid_of(0), [(PID, 1000, 95)])
    wait_for(lambda: (cgroup / "cgroup.freeze").read_text() == "1")  # at it again: paused
    agent.stop()
    assert (cgroup / "cgroup.freeze").read_text() == "0"  # a stopped agent leaves none frozen
