"""What is prepared on this node, kept on disk so that a restarted plugin neither loses
nor prepares twice a claim.

One JSON file (``<state-dir>/dra/checkpoint.json``): a version, the prepared claims by
uid (the devices kubelet was answered, the GPU slices they hold, the container edits of
their CDI spec) and a SHA-256 of the claims. It is written whole (a temporary file
renamed over it) before kubelet hears that a claim is prepared, and after it is
unprepared. It is not fsync'd (that cost 10 ms a prepare on a busy disk): a restarted
plugin process reads it back from the page cache; after a power loss the node's
containers are gone anyway, kubelet prepares the claims of the pods it starts again, and a
file torn by the crash fails its checksum. A file that cannot be read (corrupt, edited, another
version) is moved aside as ``checkpoint.json.unreadable`` and the plugin starts empty,
saying so: kubelet prepares the claims of running pods again when it restarts them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.nodeagent.envs import ContainerEdits, Mount

log = logging.getLogger(__name__)
VERSION = 1


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim: what kubelet was told and what it holds."""

    request: str
    pool: str
    device: str
    uuid: str
    memory_mib: int
    core_pct: int
    whole: bool
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    edits: ContainerEdits

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _claim_json(c: PreparedClaim) -> dict[str, Any]:
    return {"namespace": c.namespace, "name": c.name,
            "devices": [{"request": d.request, "pool": d.pool, "device": d.device,
                         "uuid": d.uuid, "memoryMiB": d.memory_mib, "corePct": d.core_pct,
                         "whole": d.whole, "cdiIds": list(d.cdi_ids)} for d in c.devices],
            "env": dict(sorted(c.edits.envs.items())),
            "mounts": [[m.container_path, m.host_path, m.read_only] for m in c.edits.mounts]}


def _claim_of(uid: str, raw: dict[str, Any]) -> PreparedClaim:
    devices = tuple(PreparedDevice(d["request"], d["pool"], d["device"], d["uuid"],
                                   int(d["memoryMiB"]), int(d["corePct"]), bool(d["whole"]),
                                   tuple(d["cdiIds"])) for d in raw["devices"])
    mounts = tuple(Mount(str(c), str(h), bool(r)) for c, h, r in raw["mounts"])
    edits = ContainerEdits({str(k): str(v) for k, v in raw["env"].items()}, mounts)
    return PreparedClaim(uid, raw["namespace"], raw["name"], devices, edits)


def _digest(claims: dict[str, Any]) -> str:
    text = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class Checkpoint:
    """The checkpoint file of one node's DRA plugin."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def load(self) -> dict[str, PreparedClaim]:
        """The prepared claims on disk ({} without a file; an unreadable one is set aside)."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            if raw.get("version") != VERSION or raw.get("checksum") != _digest(raw["claims"]):
                raise ValueError("version or checksum does not match")
            return {uid: _claim_of(uid, c) for uid, c in raw["claims"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(self.path.name + ".unreadable")
            log.error("DRA checkpoint %s is unreadable (%s); moved to %s, starting with no "
                      "prepared claims", self.path, exc, aside)
            try:
                os.replace(self.path, aside)
            except OSError as move:
                log.error("could not move it aside: %s", move)
            return {}

    def save(self, claims: dict[str, PreparedClaim]) -> None:
        """Write the prepared claims (whole, durable); ``OSError`` when it cannot."""
        body = {uid: _claim_json(c) for uid, c in sorted(claims.items())}
        text = json.dumps({"version": VERSION, "claims": body, "checksum": _digest(body)},
                          sort_keys=True, separators=(",", ":"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.path)
