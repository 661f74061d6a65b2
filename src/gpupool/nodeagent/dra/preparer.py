"""NodePrepareResources / NodeUnprepareResources for one claim, idempotent and durable.

Prepare (kubelet names a claim by namespace, name and uid):

1. a claim already in the checkpoint is answered as before (its CDI spec written again
   if the runtime's directory lost it) — kubelet retries, and asks again after restarts;
2. read the claim from the API server; its uid must be the one kubelet names, and its
   ``status.allocation`` (written by kube-scheduler; pod authors cannot write a claim's
   status) must hold devices of this node's pool (``gpupool.contract.dra.read_claim``);
3. re-check the allocation against the node: each device a GPU that is present and
   healthy, not isolated, and room left on it after the claims already prepared
   (``ClusterState.reserve``: gpupool never over-commits a GPU, whoever allocated);
4. refuse if a container of a pod the claim is reserved for sets variables that control
   its GPUs (``users.env_refusal``: the device-plugin path's rule);
5. the isolation provider's edits for the slice (memory and cores from the claim's
   ``consumedCapacity``; a device asked whole is exclusive), the GPUs exposed as the
   node's ``--device-list-strategy`` says, the slice described in ``GPUPOOL_*``; all
   written into the claim's CDI spec;
6. record the claim in the checkpoint, then answer kubelet: per device, the claim's CDI
   device and (``cdi`` strategy) the GPU's own CDI device.

Unprepare removes the CDI spec and the checkpoint entry; unpreparing a claim that is
not prepared succeeds. A refusal raises ``ClaimRefused`` with a sentence naming the claim.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpupool.contract import dra
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import GpupoolError, InvalidInput, OverCommit, UnknownName
from gpupool.core.model import Node
from gpupool.core.state import ClusterState
from gpupool.kube.errors import NotFound
from gpupool.nodeagent.dra.cdi import CdiSpecs, check_uid
from gpupool.nodeagent.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from gpupool.nodeagent.dra.claimsource import ClaimSource
from gpupool.nodeagent.dra.users import env_refusal
from gpupool.nodeagent.envs import ContainerEdits
from gpupool.nodeagent.exposure import Exposure
from gpupool.nodeagent.gpu import GpuInfo
from gpupool.nodeagent.isolation.provider import IsolationProvider, ProviderRefusal, SliceGrant

log = logging.getLogger(__name__)


class ClaimRefused(GpupoolError):
    """The claim cannot be prepared here; the message says why (kubelet shows it)."""


@dataclass(frozen=True, slots=True)
class PrepareConfig:
    node: str
    memory_unit_mib: int = 256


class Preparer:
    """Prepares and unprepares this node's claims (one at a time)."""

    def __init__(self, config: PrepareConfig, source: ClaimSource,
                 gpus: Callable[[], Sequence[GpuInfo]], checkpoint: Checkpoint, cdi: CdiSpecs,
                 exposure: Exposure, provider: IsolationProvider,
                 isolated: Callable[[], set[str]] = set):
        self.config = config
        self.source = source
        self.gpus = gpus
        self.checkpoint = checkpoint
        self.cdi = cdi
        self.exposure = exposure
        self.provider = provider
        self.isolated = isolated
        self.claims: dict[str, PreparedClaim] = {}
        self._lock = threading.Lock()
        # the node's state with the prepared claims reserved, kept while the GPUs and the
        # claims it was built for are the same (followed claim by claim)
        self._cached: tuple[tuple[GpuInfo, ...], frozenset[str], ClusterState] | None = None

    # -- start -------------------------------------------------------------------------------
    def restore(self) -> int:
        """Take the checkpoint back, rewrite lost CDI specs, drop specs of claims not in it."""
        with self._lock:
            self.claims = self.checkpoint.load()
            for claim in self.claims.values():
                self.cdi.write(claim.uid, claim.edits)
            for uid in self.cdi.known() - set(self.claims):
                log.info("removing the CDI spec of claim %s (not prepared)", uid)
                self.cdi.remove(uid)
            self._sync_provider()
            return len(self.claims)

    # -- prepare -------------------------------------------------------------------------------
    def prepare(self, namespace: str, name: str, uid: str) -> tuple[PreparedDevice, ...]:
        ref = f"{namespace}/{name}"
        try:
            check_uid(uid)
        except InvalidInput as exc:
            raise ClaimRefused(f"claim {ref}: {exc}") from None
        with self._lock:
            done = self.claims.get(uid)
            if done is not None:
                if not self.cdi.present(uid):
                    self.cdi.write(uid, done.edits)
                return done.devices
            claim = self._prepare(namespace, name, uid)
            try:
                self.checkpoint.put(claim)
            except OSError as exc:
                self.cdi.remove(uid)
                raise ClaimRefused(f"claim {ref}: cannot write the checkpoint "
                                   f"{self.checkpoint.path}: {exc}") from None
            self.claims[uid] = claim
            self._follow(claim, added=True)
        log.info("prepared claim %s (%s): %s", ref, uid, ", ".join(
            f"{d.device}={d.uuid}[{d.memory_mib} MiB, {d.core_pct} %"
            f"{', whole' if d.whole else ''}]" for d in claim.devices))
        return claim.devices

    def _prepare(self, namespace: str, name: str, uid: str) -> PreparedClaim:
        ref = f"{namespace}/{name}"
        holding, obj = self._holding(namespace, name, uid)
        slices = self._recheck(holding)
        pods = self._pods(holding, obj)
        refusal = env_refusal(pods, name)
        if refusal:
            raise ClaimRefused(f"claim {ref}: {refusal}")
        uuids = list(dict.fromkeys(s.gpu_uuid for s in slices))
        grant = SliceGrant(uid, ref, "claim", slices, holding.exclusive)
        try:
            provided = self.provider.edits(grant)
        except ProviderRefusal as exc:
            raise ClaimRefused(f"claim {ref}: {exc}") from None
        exposed = self.exposure.edits(uuids)
        edits = (describe(holding, slices, str(self.provider.name))
                 + ContainerEdits(exposed.envs, exposed.mounts) + provided)
        try:
            claim_cdi = self.cdi.write(uid, edits)
        except OSError as exc:
            raise ClaimRefused(f"claim {ref}: cannot write its CDI spec in "
                               f"{self.cdi.directory}: {exc}") from None
        devices = []
        for i, (g, s) in enumerate(zip(holding.gpus, slices, strict=True)):
            ids = ((claim_cdi,) if i == 0 else ()) + self.exposure.edits([s.gpu_uuid]).cdi_devices
            devices.append(PreparedDevice(g.request, g.device.pool, g.device.name, s.gpu_uuid,
                                          s.memory_mib, s.core_pct, g.whole, ids))
        return PreparedClaim(uid, namespace, name, tuple(devices), edits)

    def _holding(self, namespace: str, name: str, uid: str
                 ) -> tuple[dra.ClaimHolding, dict[str, Any]]:
        ref = f"{namespace}/{name}"
        try:
            obj = self.source.get_claim(namespace, name)
        except NotFound:
            raise ClaimRefused(f"claim {ref} does not exist (any more)") from None
        except GpupoolError as exc:
            raise ClaimRefused(f"claim {ref}: cannot read it: {exc}") from None
        found = str((obj.get("metadata") or {}).get("uid") or "")
        if found != uid:
            raise ClaimRefused(f"claim {ref} is another object now (uid {found}, kubelet asks "
                               f"for {uid})")
        node = self.config.node
        results = ((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}
        pools = {r.get("pool") for r in results.get("results") or []
                 if isinstance(r, dict) and r.get("driver") == dra.DRIVER}
        if pools - {node}:
            raise ClaimRefused(f"claim {ref} is allocated devices of pool(s) "
                               f"{sorted(map(str, pools - {node}))}, not of node {node}")
        try:
            holding = dra.read_claim(obj, self._table())
        except InvalidInput as exc:
            raise ClaimRefused(str(exc)) from None
        if holding is None:
            raise ClaimRefused(f"claim {ref} holds no {dra.DRIVER} device (not allocated yet?)")
        return holding, obj

    def _table(self) -> dra.DeviceTable:
        gpus = [g.to_core() for g in self.gpus()]
        return dra.devices_of_node(self.config.node, gpus, self.config.memory_unit_mib)

    def _recheck(self, holding: dra.ClaimHolding) -> tuple[Slice, ...]:
        """The claim's slices, if the node can serve them next to what it already serves."""
        state = self._state()
        isolated = self.isolated()
        for g in holding.gpus:
            if g.device.tainted:
                raise ClaimRefused(f"claim {holding.ref}: GPU {g.device.uuid} "
                                   f"({g.device.name}) is unhealthy")
            if g.device.uuid in isolated:
                raise ClaimRefused(f"claim {holding.ref}: GPU {g.device.uuid} is isolated (a "
                                   "container there uses more than its slice)")
        alloc = dra.allocation_of(holding, state.gpu_position, self.config.memory_unit_mib)
        try:
            state.reserve(alloc)
        except (OverCommit, UnknownName, InvalidInput) as exc:
            raise ClaimRefused(f"claim {holding.ref}: the node cannot serve this allocation "
                               f"next to the claims it serves: {exc}") from None
        state.release(alloc.key)  # it fits; reserved for good once it is prepared
        return alloc.slices

    def _state(self) -> ClusterState:
        """This node's GPUs (all counted present) with the prepared claims reserved."""
        known = tuple(sorted(self.gpus(), key=lambda g: g.index))
        cached = self._cached
        if cached is not None and cached[0] == known and cached[1] == frozenset(self.claims):
            return cached[2]
        gpus = tuple(replace(g.to_core(), healthy=True) for g in known)
        state = ClusterState([Node(self.config.node, 0, 0, gpus)], self.config.memory_unit_mib)
        with state.deferred():
            for claim in self.claims.values():
                self._reserve(state, claim)
        self._cached = (known, frozenset(self.claims), state)
        return state

    def _reserve(self, state: ClusterState, claim: PreparedClaim) -> None:
        node = self.config.node
        try:
            state.reserve(Allocation(dra.claim_key(claim.uid), node, 0, 0, tuple(
                Slice(d.uuid, state.gpu_position(node, d.uuid), d.memory_mib, d.core_pct,
                      d.request) for d in claim.devices)))
        except (OverCommit, UnknownName) as exc:
            log.warning("prepared claim %s does not fit this node's GPUs: %s", claim.ref, exc)

    def _follow(self, claim: PreparedClaim, added: bool) -> None:
        """Keep the cached state in step with ``self.claims`` after one claim came or went
        (dropped when it was not the state of the claims just before)."""
        cached, now = self._cached, frozenset(self.claims)
        before = now - {claim.uid} if added else now | {claim.uid}
        if cached is None or cached[1] != before:
            self._cached = None
            return
        if added:
            self._reserve(cached[2], claim)
        else:
            cached[2].release(dra.claim_key(claim.uid))
        self._cached = (cached[0], now, cached[2])

    def _pods(self, holding: dra.ClaimHolding, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The pods the claim is reserved for (as the API server has them)."""
        out = []
        for r in (obj.get("status") or {}).get("reservedFor") or []:
            if not isinstance(r, dict) or r.get("resource") != "pods":
                continue
            try:
                pod = self.source.get_pod(holding.namespace, str(r.get("name")))
            except GpupoolError as exc:
                raise ClaimRefused(f"claim {holding.ref}: cannot read pod "
                                   f"{r.get('name')}: {exc}") from None
            if pod is not None:
                out.append(pod)
        return out

    # -- unprepare ------------------------------------------------------------------------------
    def unprepare(self, uid: str) -> None:
        """Forget a claim (its CDI spec, its checkpoint entry); harmless when not prepared."""
        check_uid(uid)
        with self._lock:
            claim = self.claims.pop(uid, None)
            self.cdi.remove(uid)
            if claim is None:
                return
            try:
                self.checkpoint.drop(uid)
            except OSError as exc:
                self.claims[uid] = claim
                raise ClaimRefused(f"claim {claim.ref}: cannot write the checkpoint "
                                   f"{self.checkpoint.path}: {exc}") from None
            self._follow(claim, added=False)
            self._sync_provider()
        log.info("unprepared claim %s (%s)", claim.ref, uid)

    def _sync_provider(self) -> None:
        held: dict[str, list[Slice]] = {}
        for claim in self.claims.values():
            for d in claim.devices:
                if not d.whole:
                    held.setdefault(d.uuid, []).append(Slice(d.uuid, 0, d.memory_mib,
                                                             d.core_pct, d.request))
        try:
            self.provider.sync(held, set(self.claims))
        except GpupoolError as exc:
            log.warning("isolation provider could not follow the prepared claims: %s", exc)

    def prepared(self) -> list[PreparedClaim]:
        """The prepared claims now (a copy: safe from any thread)."""
        with self._lock:
            return list(self.claims.values())

    def held(self) -> dict[str, tuple[int, int]]:
        """GPU uuid -> (MiB, percent) the prepared claims hold on it."""
        with self._lock:
            out: dict[str, tuple[int, int]] = {}
            for claim in self.claims.values():
                for d in claim.devices:
                    m, c = out.get(d.uuid, (0, 0))
                    out[d.uuid] = (m + d.memory_mib, c + d.core_pct)
            return out


def describe(holding: dra.ClaimHolding, slices: Sequence[Slice], provider: str
             ) -> ContainerEdits:
    """The ``GPUPOOL_*`` variables of a claim: the slice, described."""
    return ContainerEdits({
        "GPUPOOL_CLAIM": holding.ref,
        "GPUPOOL_CLAIM_UID": holding.uid,
        "GPUPOOL_MODE": "exclusive" if holding.exclusive else "shared",
        "GPUPOOL_GPU_UUIDS": ",".join(s.gpu_uuid for s in slices),
        "GPUPOOL_GPU_MEMORY_MIB": ",".join(str(s.memory_mib) for s in slices),
        "GPUPOOL_GPU_CORE_PCT": ",".join(str(s.core_pct) for s in slices),
        "GPUPOOL_ISOLATION": provider,
    })
