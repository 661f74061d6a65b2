"""What is prepared on this node, kept on disk so that a restarted plugin neither loses
nor prepares twice a claim.

One small file per prepared claim, ``<state-dir>/dra/claims/<claim uid>.json``, of two
lines: a header (``{"version": 2, "uid": ..., "sha256": ...}``) and the claim (the
devices kubelet was answered, the GPU slices they hold, the container edits of its CDI
spec), the SHA-256 being that of the second line's bytes. A claim's file is written (a
temporary file renamed over it: a reader sees the old file or the new one, never half)
before kubelet hears that the claim is prepared, and removed when it is unprepared;
nothing else is rewritten, so a prepare costs one small write whatever else the node
holds. Files are not fsync'd (that cost 10 ms a prepare on a busy disk): a restarted
plugin process reads them back from the page cache; after a power loss the node's
containers are gone anyway, kubelet prepares the claims of the pods it starts again, and
a file torn by the crash fails its checksum.

A claim file that cannot be read (torn, edited, another version, not named after its
claim) is moved aside as ``<uid>.json.unreadable`` and that claim is forgotten, saying
so: kubelet prepares it again when it restarts the pod. The single file of earlier
versions (``<state-dir>/dra/checkpoint.json``, every claim with one checksum) is read
once, written out as claim files and removed.
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
VERSION = 2


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


def encode(claim: PreparedClaim) -> bytes:
    """A claim file's bytes: the header line, then the claim's line."""
    body = json.dumps(_claim_json(claim), sort_keys=True, separators=(",", ":")).encode()
    head = json.dumps({"version": VERSION, "uid": claim.uid,
                       "sha256": hashlib.sha256(body).hexdigest()}, sort_keys=True)
    return head.encode() + b"\n" + body + b"\n"


def decode(uid: str, data: bytes) -> PreparedClaim:
    """The claim of a file named after ``uid``; ``ValueError`` (or a ``KeyError`` /
    ``TypeError`` of a malformed claim) when it is not a whole, unedited claim file."""
    head_line, sep, body = data.partition(b"\n")
    head = json.loads(head_line)
    if not sep or not isinstance(head, dict) or head.get("version") != VERSION:
        raise ValueError("not a claim file of this version")
    body = body.rstrip(b"\n")
    if head.get("sha256") != hashlib.sha256(body).hexdigest() or head.get("uid") != uid:
        raise ValueError("checksum or claim uid does not match")
    return _claim_of(uid, json.loads(body))


class Checkpoint:
    """The claim files of one node's DRA plugin (``directory``); ``legacy`` is the single
    file of earlier versions, taken over by ``load``."""

    def __init__(self, directory: Path, legacy: Path | None = None):
        self.path = Path(directory)
        self.legacy = legacy

    def load(self) -> dict[str, PreparedClaim]:
        """The prepared claims on disk ({} without any; unreadable files set aside)."""
        claims = self._take_legacy()
        if not self.path.is_dir():
            return claims
        for tmp in self.path.glob(".*.tmp"):  # a write interrupted before its rename
            tmp.unlink(missing_ok=True)
        for file in sorted(self.path.glob("*.json")):
            uid = file.name.removesuffix(".json")
            try:
                claims[uid] = decode(uid, file.read_bytes())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                self._set_aside(file, f"claim {uid}: {exc}")
        return claims

    def put(self, claim: PreparedClaim) -> None:
        """Write one claim's file (whole: renamed into place); ``OSError`` when it cannot."""
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{claim.uid}.json.tmp"
        tmp.write_bytes(encode(claim))
        os.replace(tmp, self.path / f"{claim.uid}.json")

    def drop(self, uid: str) -> None:
        """Remove one claim's file (none: nothing to do); ``OSError`` when it cannot."""
        (self.path / f"{uid}.json").unlink(missing_ok=True)

    def _take_legacy(self) -> dict[str, PreparedClaim]:
        if self.legacy is None or not self.legacy.exists():
            return {}
        try:
            raw = json.loads(self.legacy.read_text(encoding="utf-8"))
            if raw.get("version") != 1 or raw.get("checksum") != _digest(raw["claims"]):
                raise ValueError("version or checksum does not match")
            claims = {uid: _claim_of(uid, c) for uid, c in raw["claims"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self._set_aside(self.legacy, str(exc))
            return {}
        try:  # a write that fails keeps the old file, which is taken over at the next start
            for claim in claims.values():
                self.put(claim)
            self.legacy.unlink(missing_ok=True)
        except OSError as exc:
            log.error("DRA checkpoint %s could not be taken over (%s); it is kept and "
                      "taken over at the next start", self.legacy, exc)
            return claims
        log.info("DRA checkpoint %s taken over as %d claim files in %s", self.legacy,
                 len(claims), self.path)
        return claims

    @staticmethod
    def _set_aside(file: Path, why: str) -> None:
        aside = file.with_name(file.name + ".unreadable")
        log.error("DRA checkpoint file %s is unreadable (%s); moved to %s: that claim is "
                  "forgotten until kubelet prepares it again", file, why, aside)
        try:
            os.replace(file, aside)
        except OSError as move:
            log.error("could not move it aside: %s", move)
