"""CDI spec files for prepared claims: what the container runtime injects.

Kubelet passes the CDI device IDs a DRA driver returns to the container runtime
(containerd ≥ 1.7, CRI-O ≥ 1.23 with CDI enabled), which reads the specs in its CDI
directories (``/var/run/cdi`` by default) and applies their ``containerEdits`` to the
container. Each prepared claim gets one spec file, ``gpu.gpupool.io-claim_<uid>.json``,
of kind ``gpu.gpupool.io/claim`` with one device named after the claim's uid: the
slice described (``GPUPOOL_*``), the GPUs exposed (volume-mounts or envvar strategy)
and the isolation provider's limits and mounts. CDI's environment edits replace a
variable the container set itself, so a pod's own ``env`` cannot override them.

Files are written whole (a temporary file renamed into place), so a runtime never
reads half a spec. They are not fsync'd: the checkpoint is the durable record, and the
plugin writes the specs of the claims it holds again when it starts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.envs import ContainerEdits

CDI_VERSION = "0.5.0"
CLAIM_KIND = "gpu.gpupool.io/claim"
DEFAULT_CDI_DIR = Path("/var/run/cdi")
_PREFIX = CLAIM_KIND.replace("/", "-") + "_"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def check_uid(uid: str) -> str:
    """``uid`` if it can name a CDI device and a file (a Kubernetes uid always can)."""
    if not _UID.match(uid):
        raise InvalidInput(f"claim uid {uid!r} is not a Kubernetes uid")
    return uid


def spec_of(uid: str, edits: ContainerEdits, kind: str = CLAIM_KIND) -> dict[str, Any]:
    """The CDI spec of one prepared claim."""
    mounts = [{"hostPath": m.host_path, "containerPath": m.container_path,
               "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"]}
              for m in edits.mounts]
    container: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(edits.envs.items())]}
    if mounts:
        container["mounts"] = mounts
    return {"cdiVersion": CDI_VERSION, "kind": kind,
            "devices": [{"name": check_uid(uid), "containerEdits": container}]}


class CdiSpecs:
    """The spec files of prepared claims in one CDI directory."""

    def __init__(self, directory: Path, kind: str = CLAIM_KIND):
        self.directory = Path(directory)
        self.kind = kind

    def path(self, uid: str) -> Path:
        return self.directory / f"{_PREFIX}{check_uid(uid)}.json"

    def device_id(self, uid: str) -> str:
        """The fully qualified CDI device name kubelet hands the runtime."""
        return f"{self.kind}={check_uid(uid)}"

    def write(self, uid: str, edits: ContainerEdits) -> str:
        """Write (or rewrite) the claim's spec; its CDI device ID."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path(uid)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(spec_of(uid, edits, self.kind), indent=1, sort_keys=True),
                       encoding="utf-8")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        return self.device_id(uid)

    def present(self, uid: str) -> bool:
        return self.path(uid).is_file()

    def remove(self, uid: str) -> None:
        self.path(uid).unlink(missing_ok=True)

    def known(self) -> set[str]:
        """Uids of the claim specs in the directory."""
        if not self.directory.is_dir():
            return set()
        return {p.name[len(_PREFIX):-len(".json")] for p in self.directory.iterdir()
                if p.name.startswith(_PREFIX) and p.name.endswith(".json")}
