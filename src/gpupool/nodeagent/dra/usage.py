"""The usage monitor on a DRA node: what containers use of the GPUs their claims hold.

On the device-plugin path a container's grant is its slice in the pod's verified
decision; on a DRA node it is what the prepared claims hold (the checkpoint: the
``consumedCapacity`` memory and cores of each device, or the whole device). A claim is
used by the containers that list it in ``resources.claims`` (``users.claim_uses``: the
pod names the claim directly or through a template, the generated name read from the
pod's ``status.resourceClaimStatuses``), in pods of the claim's namespace on this node —
Kubernetes' own rule for who may share a claim.

Per pod and GPU, the containers that use a prepared claim with a device on that GPU are
judged together, as one entry named by their names joined with ``+`` (two containers
sharing one claim share its slice): their processes' memory and SM utilisation, summed,
against the sum of those claims' slices on that GPU (a claim counted once however many
containers use it; a whole device cannot be exceeded). A process of any other container
on that GPU is compared with zero, as on the device-plugin path. Everything after that
— the grace period, the Events, the annotation, the metrics, warn / isolate / evict —
is the device-plugin path's (``monitor``, ``overuse``, ``actions``).

Not judged together: several pods sharing one claim (each pod is compared with the whole
claim on its own).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from gpupool.core.allocation import Slice
from gpupool.nodeagent.dra.checkpoint import PreparedClaim
from gpupool.nodeagent.monitor import Attribution, Held, SliceKey
from gpupool.nodeagent.pods import Pod

ClaimUses = Callable[[Pod], Mapping[str, frozenset[str]]]  # container -> claim names


def claim_grants(claims: Iterable[PreparedClaim], pods: Sequence[Pod], uses: ClaimUses
                 ) -> tuple[dict[SliceKey, Held], dict[SliceKey, str]]:
    """(grants by (pod uid, entry, GPU), each (pod uid, container, GPU) -> its entry)."""
    by_name = {(c.namespace, c.name): c for c in claims}
    held: dict[SliceKey, Held] = {}
    member: dict[SliceKey, str] = {}
    for pod in pods:
        if not pod.active:
            continue
        per_gpu = _per_gpu(pod, uses(pod), by_name)
        for gpu, (names, mine) in per_gpu.items():
            entry = "+".join(sorted(names))
            held[(pod.uid, entry, gpu)] = _held(gpu, entry, mine)
            member.update({(pod.uid, n, gpu): entry for n in names})
    return held, member


def _per_gpu(pod: Pod, uses: Mapping[str, frozenset[str]],
             by_name: Mapping[tuple[str, str], PreparedClaim]
             ) -> dict[str, tuple[set[str], dict[str, PreparedClaim]]]:
    out: dict[str, tuple[set[str], dict[str, PreparedClaim]]] = defaultdict(
        lambda: (set(), {}))
    for container, names in uses.items():
        for name in names:
            claim = by_name.get((pod.namespace, name))
            if claim is None:
                continue
            for d in claim.devices:
                containers, mine = out[d.uuid]
                containers.add(container)
                mine[claim.uid] = claim
    return out


def _held(gpu: str, entry: str, claims: Mapping[str, PreparedClaim]) -> Held:
    devices = [d for c in claims.values() for d in c.devices if d.uuid == gpu]
    whole = any(d.whole for d in devices)
    return Held(Slice(gpu, 0, sum(d.memory_mib for d in devices),
                      sum(d.core_pct for d in devices), entry), whole)


class ClaimAttribution(Attribution):
    """``Attribution`` whose entries are a pod's claim-using containers per GPU."""

    def __init__(self, proc_root: Path, pods: Sequence[Pod],
                 grants: tuple[dict[SliceKey, Held], dict[SliceKey, str]]):
        super().__init__(proc_root, pods, grants[0])
        self.member = grants[1]

    def _key(self, pid: int, gpu: str) -> SliceKey | None:
        key = super()._key(pid, gpu)
        if key is None:
            return None
        entry = self.member.get(key)
        return (key[0], entry, gpu) if entry is not None else key


def attribution(proc_root: Path, claims: Callable[[], Iterable[PreparedClaim]],
                uses: ClaimUses) -> Callable[[Sequence[Pod]], Attribution]:
    """What ``UsageMonitor`` calls at each sample on a DRA node."""
    def make(pods: Sequence[Pod]) -> Attribution:
        return ClaimAttribution(proc_root, pods, claim_grants(claims(), pods, uses))
    return make
