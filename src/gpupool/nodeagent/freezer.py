"""Pausing a container: the cgroup v2 freezer (``cgroup.freeze``).

A process's cgroup is the ``0::<path>`` line of ``/proc/<pid>/cgroup`` (cgroup v2). Seen
from the agent's own cgroup namespace the path may start with ``/..``; the part from the
first ``kubepods`` directory on is kubelet's, so it is resolved under ``cgroup_root`` (the
host's ``/sys/fs/cgroup``, mounted into the agent). Writing ``1`` to the cgroup's
``cgroup.freeze`` stops every process of the container (on the GPU its kernels finish and
no new work is queued; its GPU memory stays allocated), ``0`` lets them run on.
``FreezeFailed`` says why not: cgroup v1, the cgroup gone, no permission.
"""

from __future__ import annotations

from pathlib import Path

from gpupool.core.errors import GpupoolError


class FreezeFailed(GpupoolError):
    """The container could not be paused or resumed; the message says why."""


class Freezer:
    def __init__(self, proc_root: Path = Path("/proc"),
                 cgroup_root: Path = Path("/sys/fs/cgroup")):
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root

    def cgroup_of(self, pid: int) -> Path:
        """The cgroup directory of process ``pid`` under ``cgroup_root``."""
        path = self.proc_root / str(pid) / "cgroup"
        try:
            text = path.read_text()
        except OSError as exc:
            raise FreezeFailed(f"cannot read {path}: {exc.strerror or exc}") from None
        line = next((ln for ln in text.splitlines() if ln.startswith("0::")), None)
        if line is None:
            raise FreezeFailed(f"process {pid} is not in a cgroup v2 hierarchy ({path}): the "
                               "freezer needs cgroup v2")
        parts = [p for p in line[3:].split("/") if p and p != ".."]
        start = next((i for i, p in enumerate(parts) if p.startswith("kubepods")), None)
        if start is None:
            raise FreezeFailed(f"process {pid} is not in a pod's cgroup ({line[3:]})")
        return self.cgroup_root.joinpath(*parts[start:])

    def set(self, cgroup: Path, frozen: bool) -> None:
        """Freeze (True) or thaw the cgroup."""
        control = cgroup / "cgroup.freeze"
        try:
            control.write_text("1" if frozen else "0")
        except FileNotFoundError:
            raise FreezeFailed(f"{control} does not exist (the container is gone, or the "
                               "host's cgroup v2 hierarchy is not mounted there)") from None
        except OSError as exc:
            raise FreezeFailed(f"cannot write {control}: {exc.strerror or exc}") from None

    def frozen(self, cgroup: Path) -> bool:
        """Whether the cgroup is frozen now (``cgroup.events``' ``frozen 1``)."""
        try:
            events = (cgroup / "cgroup.events").read_text()
        except OSError:
            return False
        return "frozen 1" in events.splitlines()
