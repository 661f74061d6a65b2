"""The data-plane provider's process: pinned to the decided GPU, limited, on loopback only.

The slice server starts the provider's server as a child process (``ProviderProcess``)
with an environment built here (``pinned_env``):

* ``CUDA_VISIBLE_DEVICES=<GPU uuid>`` — the process sees the decided GPU only, as
  device 0;
* the node's isolation provider's limit variables for the slice
  (``gpupool.contract.isolation``: the same rule as for local containers), and what
  the provider needs to reach the process: ``mps`` — ``CUDA_MPS_PIPE_DIRECTORY`` when
  the node's pipe directory is not the default; ``hami-core`` — HAMi-core's library in
  ``LD_PRELOAD`` (the tenant cannot reach this process, so a variable is enough here);
* for ``command`` providers, what the command line asks (``{port}`` in arguments and
  variables is the provider's loopback port).

Providers: ``stub`` (``gpupool slice-stub``, the stand-in; ``stub_argv``) and
``command`` (any server, e.g. LUPINE's, given as a command line: docs/remote.md). The
provider's port is meant for the terminator on loopback alone. Some servers listen on
every interface whatever they are told (LUPINE does); ``exposure`` finds a listener of
the port beyond loopback in ``/proc/net/tcp{,6}``, and the slice server refuses to go
on with one unless told that a NetworkPolicy admits only the TLS port to its pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.contract.isolation import ProviderName, limits
from gpupool.core.allocation import Slice
from gpupool.core.errors import GpupoolError

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


class ProviderError(GpupoolError):
    """The provider could not be started or stopped serving; the message says why."""


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """The slice a server serves, as decided: whose, which GPU, how much."""

    pod_uid: str
    pod_ref: str
    container: str
    gpu_uuid: str
    memory_mib: int
    core_pct: int
    exclusive: bool = False

    def as_slice(self) -> Slice:
        return Slice(self.gpu_uuid, 0, self.memory_mib, self.core_pct, self.container)


@dataclass(frozen=True, slots=True)
class Isolation:
    """The node's isolation provider, and where its parts are on this node."""

    provider: ProviderName = ProviderName.NONE
    mps_pipe_directory: str = ""
    hami_core_library: str = ""


def pinned_env(base: Mapping[str, str], spec: SliceSpec, isolation: Isolation) -> dict[str, str]:
    """The provider process's environment: ``base`` pinned to the slice's GPU and limits."""
    env = {k: v for k, v in base.items()
           if not k.startswith(("CUDA_MPS_", "CUDA_DEVICE_")) and k != "LD_PRELOAD"}
    env["CUDA_VISIBLE_DEVICES"] = spec.gpu_uuid
    if not spec.exclusive:
        env.update(limits(isolation.provider, [spec.as_slice()]))
        if isolation.provider is ProviderName.MPS and isolation.mps_pipe_directory:
            env["CUDA_MPS_PIPE_DIRECTORY"] = isolation.mps_pipe_directory
        if isolation.provider is ProviderName.HAMI_CORE:
            if not isolation.hami_core_library:
                raise ProviderError("the hami-core isolation provider needs HAMi-core's "
                                    "library (--hami-core-library)")
            env["LD_PRELOAD"] = isolation.hami_core_library
    return env


def stub_argv(port: int, spec: SliceSpec, python: str = sys.executable) -> tuple[str, ...]:
    """The stub provider's command line (``gpupool slice-stub``) for ``spec``."""
    return (python, "-m", "gpupool.cli.main", "slice-stub", "--host", LOOPBACK, "--port",
            str(port), "--memory-limit-mib", str(max(1, spec.memory_mib)))


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    start_s: float = 30.0
    allow_exposed: bool = False
    proc_net: Path = Path("/proc/net")


def expand(words: Sequence[str], port: int) -> tuple[str, ...]:
    return tuple(w.replace("{port}", str(port)) for w in words)


class ProviderProcess:
    """The running provider: started, checked for a loopback listener, stopped."""

    def __init__(self, spec: ProviderSpec):
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> None:
        argv, env = self.spec.argv, dict(self.spec.env)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=asyncio.subprocess.DEVNULL)
        except OSError as exc:
            raise ProviderError(f"cannot start the provider {argv[0]!r}: "
                                f"{exc.strerror or exc}") from None
        log.info("provider started: pid %d, %s", self.proc.pid, " ".join(argv))
        try:
            await self._wait_listening()
            exposed = exposure(self.spec.port, self.spec.proc_net)
            if exposed and not self.spec.allow_exposed:
                raise ProviderError(
                    f"the provider listens on port {self.spec.port} beyond loopback "
                    f"({', '.join(exposed)}), where it could be reached without gpupool's "
                    "TLS; give --allow-exposed-provider only where a NetworkPolicy admits "
                    "nothing but the TLS port to this pod")
            if exposed:
                log.warning("the provider listens beyond loopback (%s); relying on the "
                            "pod's NetworkPolicy", ", ".join(exposed))
        except BaseException:
            await self.stop()
            raise

    async def _wait_listening(self) -> None:
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spec.start_s
        while True:
            if self.proc.returncode is not None:
                raise ProviderError(f"the provider {self.spec.argv[0]!r} exited with "
                                    f"{self.proc.returncode} before it listened on "
                                    f"{LOOPBACK}:{self.spec.port}")
            try:
                _, writer = await asyncio.open_connection(LOOPBACK, self.spec.port)
            except OSError:
                if loop.time() > deadline:
                    raise ProviderError(f"the provider did not listen on {LOOPBACK}:"
                                        f"{self.spec.port} within {self.spec.start_s:g} s"
                                        ) from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return

    async def stop(self, grace_s: float = 5.0) -> int | None:
        """Terminate the provider (SIGTERM, then SIGKILL after ``grace_s``); its exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        log.info("provider stopped: pid %d, exit %s", proc.pid, proc.returncode)
        return proc.returncode


def exposure(port: int, proc_net: Path = Path("/proc/net")) -> list[str]:
    """Addresses beyond loopback on which something listens on TCP ``port``."""
    found = []
    for name, width in (("tcp", 4), ("tcp6", 16)):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and not _loopback(address, width):
                found.append(_text(address, width))
    return found


def _raw(address: str, width: int) -> bytes:
    """/proc/net's hex address (32-bit words in host order) as network-order bytes."""
    words = [int(address[i:i + 8], 16) for i in range(0, width * 2, 8)]
    return b"".join(struct.pack("=I", w) for w in words)


def _loopback(address: str, width: int) -> bool:
    raw = _raw(address, width)
    if width == 4:
        return raw[0] == 127
    return raw == bytes(15) + b"\x01" or (raw[:12] == bytes(10) + b"\xff\xff" and raw[12] == 127)


def _text(address: str, width: int) -> str:
    raw = _raw(address, width)
    return socket.inet_ntop(socket.AF_INET if width == 4 else socket.AF_INET6, raw)
