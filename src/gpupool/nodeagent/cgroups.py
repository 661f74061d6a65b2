"""Which pod and container a process belongs to: ``/proc/<pid>/cgroup``.

Kubelet puts every container in a cgroup whose path names the pod UID and the
container runtime's id, in one of these forms (cgroup v1 lines are
``<id>:<controllers>:<path>``, the v2 line is ``0::<path>``):

* systemd driver: ``.../kubepods-burstable-pod<uid with _ for ->.slice/
  cri-containerd-<id>.scope`` (containerd), ``crio-<id>.scope`` (CRI-O),
  ``docker-<id>.scope`` (Docker / cri-dockerd);
* cgroupfs driver: ``.../kubepods/burstable/pod<uid>/<id>`` (all runtimes).

``owner`` reads the file under ``proc_root`` (the host's ``/proc``, mounted into the
agent) and returns the pod UID and container id, or raises ``CgroupUnreadable`` with
the reason: the process is gone, the file cannot be read, or the process is not in a
pod's container (host processes, the MPS server). A sample skips such processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpupool.core.errors import GpupoolError

_POD = re.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}"
                  r"[-_][0-9a-fA-F]{12})(?:\.slice)?$")
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})"
                        r"(?:\.scope)?$")


class CgroupUnreadable(GpupoolError):
    """The process's pod cannot be told; the message says why."""


@dataclass(frozen=True, slots=True)
class Owner:
    pod_uid: str
    container_id: str


def parse(text: str) -> Owner | None:
    """The pod and container named by a ``/proc/<pid>/cgroup`` text (None: not a pod's)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        found = owner_of_path(path)
        if found is not None:
            return found
    return None


def owner_of_path(path: str) -> Owner | None:
    uid = None
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        pod = _POD.search(part)
        if pod is not None:
            uid = pod.group(1).replace("_", "-").lower()
            rest = parts[i + 1:]
            ident = _CONTAINER.match(rest[0]) if rest else None
            return Owner(uid, ident.group(1)) if ident else Owner(uid, "")
    return None


def owner(proc_root: Path, pid: int) -> Owner:
    """The pod and container of process ``pid``; ``CgroupUnreadable`` says why not."""
    path = Path(proc_root) / str(pid) / "cgroup"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CgroupUnreadable(f"process {pid} is gone ({path} does not exist)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CgroupUnreadable(f"cannot read {path}: {exc}") from None
    found = parse(text)
    if found is None:
        raise CgroupUnreadable(f"process {pid} is not in a pod's container ({path})")
    return found
