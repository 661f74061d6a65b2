"""Credentials and slices for the remote-slice tests."""

from __future__ import annotations

import time
from pathlib import Path

from gpupool.remote.credentials import CredentialPaths
from gpupool.remote.provider import SliceSpec
from gpupool.security import certs, sessions

POD_UID = "0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01"
OTHER_UID = "9f3e1b2a-0000-4c3e-9a8f-5b9d2a6f7e02"
GPU = "GPU-5a1c0de0-0000-4000-8000-000000000001"
MIB = 1 << 20


def slice_spec(memory_mib: int = 1, core_pct: int = 10, uid: str = POD_UID) -> SliceSpec:
    return SliceSpec(uid, "default/trainer", "main", GPU, memory_mib, core_pct)


def write_dir(path: Path, ca: certs.PemPair, pair: certs.PemPair) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "tls.crt").write_text(pair.cert)
    (path / "tls.key").write_text(pair.key)
    (path / "ca.crt").write_text(ca.cert)
    return path


def paths(path: Path, revocations: Path | None = None) -> CredentialPaths:
    return CredentialPaths(path / "tls.crt", path / "tls.key", path / "ca.crt", revocations)


class Authority:
    """gpupool's CA for one test, and the credentials it issues."""

    def __init__(self, root: Path):
        self.root = root
        self.ca = certs.new_ca("gpupool-ca", time.time())

    def server(self, uid: str = POD_UID, name: str = "server") -> Path:
        return write_dir(self.root / name, self.ca,
                         sessions.issue_server(self.ca, uid, time.time()))

    def client(self, uid: str = POD_UID, name: str = "client", lifetime_s: float = 3600.0,
               issued_s_ago: float = 0.0) -> Path:
        pair = sessions.issue_client(self.ca, uid, time.time() - issued_s_ago, lifetime_s)
        return write_dir(self.root / name, self.ca, pair)

    def foreign_client(self, uid: str = POD_UID, name: str = "foreign") -> Path:
        """A client certificate of another CA (with the same name), trusting this one."""
        other = certs.new_ca("gpupool-ca", time.time())
        return write_dir(self.root / name, self.ca,
                         sessions.issue_client(other, uid, time.time()))

    def serial(self, directory: Path) -> int:
        return certs.load_certificate((directory / "tls.crt").read_text()).serial_number

    def revoke(self, path: Path, *serials: int) -> Path:
        path.write_text(sessions.revocation_list(self.ca, serials, time.time()))
        return path
