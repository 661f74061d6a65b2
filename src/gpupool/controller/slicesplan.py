"""What the controller does for remote GPU slices this round: pure, time passed in.

For every live pod whose signed decision is served by a slice server (``servedBy``),
``plan`` keeps exactly one **server pod** on the decided node and GPU, its **Service**,
the server's **TLS Secret** and the sidecar's (``sliceserver``, ``contract.slices``), and
says what became of the server on the pod (``gpupool.io/slice-status``, with an Event when
the state changes):

* ``starting`` → ``serving`` once the server pod is ready (its readiness probe reads the
  server's ``/healthz``);
* **lost**: a server that was serving and has not been ready for ``lost_after_s`` (its
  process stopped answering, or its node went away: the node's pods are then marked not
  ready) is deleted; the pod's decision is placed again by the extender (the slice's
  node is left out), and the next server starts where the new decision says. What was on
  the GPU is gone;
* **failed**: a server that exited with an error, or never became ready within
  ``start_deadline_s`` (an image that cannot be pulled, a provider that cannot start, no
  room for the server pod on the node), is deleted and reported with its reason; placed
  again like a lost one. A lost or failed slice the extender has not placed elsewhere
  after ``retry_s`` is served again where its decision says;
* a server that released its slice (exit 0: the sidecar was silent past its deadline,
  or never connected) while the pod lives is started again on the same GPU;
* ``unserved``: no server can be made (no provider configured, no slice name, a slice
  name another pod holds).

Credentials: the server's and the sidecar's certificates are issued when missing and
renewed when a third of their life is left (``certs.renewal_due``); a renewed one is left
to expire (channels opened with it stay open until then), one issued for another pod is
revoked. Everything of a slice whose pod is gone, finished, or no longer served remotely
is deleted and its certificates revoked: nothing is held once both sides are gone (the
sidecar's Secret, owned by its pod, goes with it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpupool.contract import slices
from gpupool.contract.devices import parse_time
from gpupool.contract.slices import SliceState, SliceStatus
from gpupool.controller.sliceserver import Obj, Served, ServerSettings, server_pod, service
from gpupool.security.certs import RENEW_FRACTION
from gpupool.security.sessions import SESSION_S, iso


@dataclass(frozen=True, slots=True)
class RemotePod:
    """A live pod whose counted decision is served by a slice server."""

    served: Served
    status: SliceStatus | None
    bound_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ServerSeen:
    """A server pod as listed (``ready_since_s``: when its Ready condition last changed)."""

    name: str
    slice_name: str
    uid: str
    generation: int
    node: str
    gpu: str
    phase: str = "Pending"
    ready: bool = False
    changed_s: float | None = None
    created_s: float | None = None
    deleting: bool = False
    message: str = ""  # why it ended, or why it waits (its container's state)


@dataclass(frozen=True, slots=True)
class CredentialSeen:
    """A slice's server Secret: its certificate and the sidecar's it records."""

    slice_name: str
    uid: str
    serial: int
    expires_s: float
    client_serial: int = 0
    client_expires_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Timing:
    lost_after_s: float = 30.0  # a serving server not ready this long is lost
    start_deadline_s: float = 300.0  # a new server not ready this long has failed
    retry_s: float = 120.0  # a lost or failed slice not placed again by then: served again
    lifetime_s: float = SESSION_S  # of the session certificates


# -- actions --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CreateObject:
    kind: str  # Pod | Service
    obj: Obj


@dataclass(frozen=True, slots=True)
class DeleteObject:
    kind: str  # Pod | Service | Secret
    name: str


@dataclass(frozen=True, slots=True)
class Issue:
    """A certificate for slice ``served``: the server's, or (``client``) the sidecar's."""

    served: Served
    client: bool


@dataclass(frozen=True, slots=True)
class Mark:
    """Write ``status`` on the pod; ``event``: (reason, message, warning) to record."""

    served: Served
    status: SliceStatus
    event: tuple[str, str, bool] | None = None


@dataclass(slots=True)
class SlicePlan:
    actions: list[CreateObject | DeleteObject | Issue | Mark] = field(default_factory=list)
    revoke: dict[int, float] = field(default_factory=dict)  # serial -> its expiry
    states: dict[str, int] = field(default_factory=dict)  # slices per state, for metrics
    lost: int = 0  # servers found lost this round


EVENTS = {SliceState.SERVING: ("GpupoolSliceServing", False),
          SliceState.LOST: ("GpupoolSliceLost", True),
          SliceState.FAILED: ("GpupoolSliceFailed", True),
          SliceState.UNSERVED: ("GpupoolSliceUnserved", True)}
NOT_ENABLED = ("remote GPU slices are not enabled on this cluster (no data-plane provider): "
               "no slice server is started")


def plan(remote: Sequence[RemotePod], servers: Sequence[ServerSeen], services: Mapping[str, str],
         credentials: Sequence[CredentialSeen], isolation: Mapping[str, str],
         settings: ServerSettings, now: float, timing: Timing = Timing()) -> SlicePlan:
    """This round's writes. ``services``: Service name -> the pod uid it serves;
    ``isolation``: GPU uuid -> its node's isolation provider."""
    out = SlicePlan()
    kept = _owners(remote, out, settings, now)
    for r in remote:
        if kept.get(r.served.slice_name) is r:
            _serve(r, servers, services, credentials, isolation, settings, now, timing, out)
    _clean(kept, servers, services, credentials, out)
    return out


def _owners(remote: Sequence[RemotePod], out: SlicePlan, settings: ServerSettings,
            now: float) -> dict[str, RemotePod]:
    """The pod each slice name serves (the first bound; the others are told why not)."""
    kept: dict[str, RemotePod] = {}
    for r in sorted(remote, key=lambda r: (r.bound_s, r.served.uid)):
        name = r.served.slice_name
        why = ""
        if not settings.provider or settings.provider == "none":
            why = NOT_ENABLED
        elif not name:
            why = ("the pod has no slice name (gpupool.io/slice): it was created without "
                   "gpupool's admission webhook, which gives the sidecar its server's address")
        elif name in kept:
            why = f"its slice name {name} is already used by pod {kept[name].served.ref}"
        if why:
            _mark(r, SliceStatus(SliceState.UNSERVED, reason=why), now, out)
        else:
            kept[name] = r
    return kept


def _serve(r: RemotePod, servers: Sequence[ServerSeen], services: Mapping[str, str],
           credentials: Sequence[CredentialSeen], isolation: Mapping[str, str],
           settings: ServerSettings, now: float, timing: Timing, out: SlicePlan) -> None:
    s = r.served
    service_name = slices.service_name(s.slice_name)
    if service_name not in services:
        out.actions.append(CreateObject("Service", service(s.slice_name, s.uid,
                                                           settings.namespace)))
    _credentials(r, credentials, now, timing, out)
    mine = [v for v in servers if v.slice_name == s.slice_name]
    live = [v for v in mine if v.uid == s.uid and not v.deleting]
    current = max(live, key=lambda v: v.generation) if live else None
    for stale in live:
        if stale is not current:
            out.actions.append(DeleteObject("Pod", stale.name))
    generation = 1 + max((v.generation for v in mine), default=0)
    status = _server_state(r, current, settings, now, timing, out)
    if status is None:  # (re)start a server where the decision says
        if _waiting(r, now, timing):  # for the extender to place it again elsewhere
            status = r.status
        else:
            pod = server_pod(s, generation, settings, isolation.get(s.piece.gpu_uuid, "none"))
            out.actions.append(CreateObject("Pod", pod))
            why = r.status.reason if r.status is not None and \
                r.status.state is SliceState.STARTING else ""
            status = SliceStatus(SliceState.STARTING, s.allocation.gpu_node,
                                 f"{settings.namespace}/{pod['metadata']['name']}", why)
    assert status is not None
    _mark(r, status, now, out)


def _waiting(r: RemotePod, now: float, timing: Timing) -> bool:
    """Whether a lost or failed slice still waits to be placed again: its decision names
    the node it was lost on, for less than ``retry_s`` (then it is served there again)."""
    st = r.status
    if st is None or st.state not in (SliceState.LOST, SliceState.FAILED) or \
            st.node != r.served.allocation.gpu_node:
        return False
    since = parse_time(st.since)
    return since is None or now - since < timing.retry_s


def _server_state(r: RemotePod, v: ServerSeen | None, settings: ServerSettings, now: float,
                  timing: Timing, out: SlicePlan) -> SliceStatus | None:
    """What the current server ``v`` says (None: a server must be started)."""
    if v is None:
        return None
    s = r.served
    where = f"{s.allocation.gpu_node} ({s.piece.gpu_uuid})"
    server = f"{settings.namespace}/{v.name}"
    if v.node != s.allocation.gpu_node or v.gpu != s.piece.gpu_uuid:
        out.actions.append(DeleteObject("Pod", v.name))  # the decision moved: follow it
        return None
    if v.phase == "Running" and v.ready:
        return SliceStatus(SliceState.SERVING, v.node, server)
    if v.phase == "Succeeded":  # released: the sidecar was silent or never came
        out.actions.append(DeleteObject("Pod", v.name))
        return replace(SliceStatus(SliceState.STARTING), reason=(
            f"the previous server released the slice ({v.message or 'no reason given'}); "
            "a new one starts"))
    serving = r.status is not None and r.status.state is SliceState.SERVING
    if v.phase == "Failed":
        out.actions.append(DeleteObject("Pod", v.name))
        state = SliceState.LOST if serving else SliceState.FAILED
        return SliceStatus(state, v.node, server, f"the slice server on {where} "
                                                  f"ended: {v.message or 'failed'}")
    silent = now - (v.changed_s if v.changed_s is not None else now)
    if serving and silent > timing.lost_after_s:
        out.lost += 1
        out.actions.append(DeleteObject("Pod", v.name))
        return SliceStatus(SliceState.LOST, v.node, server,
                           f"the slice server on {where} has not answered for "
                           f"{silent:.0f} s")
    age = now - (v.created_s if v.created_s is not None else now)
    if not serving and age > timing.start_deadline_s:
        out.actions.append(DeleteObject("Pod", v.name))
        return SliceStatus(SliceState.FAILED, v.node, server,
                           f"the slice server on {where} did not become ready within "
                           f"{timing.start_deadline_s:.0f} s"
                           + (f": {v.message}" if v.message else ""))
    if serving:
        return r.status
    return SliceStatus(SliceState.STARTING, v.node, server, v.message)


def _credentials(r: RemotePod, credentials: Sequence[CredentialSeen], now: float,
                 timing: Timing, out: SlicePlan) -> None:
    """Issue what is missing or due. Certificates of another pod are revoked; renewed ones
    are not: they expire within a third of their life, and until then the channels opened
    with them stay open (the server closes a channel whose certificate is revoked)."""
    s = r.served
    held = next((c for c in credentials if c.slice_name == s.slice_name), None)
    foreign = held is not None and held.uid != s.uid
    if held is not None and foreign:
        out.revoke[held.serial] = held.expires_s
        if held.client_serial:
            out.revoke[held.client_serial] = held.client_expires_s
    if held is None or foreign or _due(held.expires_s, now, timing):
        out.actions.append(Issue(s, client=False))
    if held is None or foreign or not held.client_serial or \
            _due(held.client_expires_s, now, timing):
        out.actions.append(Issue(s, client=True))


def _due(expires_s: float, now: float, timing: Timing) -> bool:
    return now >= expires_s - timing.lifetime_s * RENEW_FRACTION


def _clean(kept: Mapping[str, RemotePod], servers: Iterable[ServerSeen],
           services: Mapping[str, str], credentials: Iterable[CredentialSeen],
           out: SlicePlan) -> None:
    """Everything of a slice no live remote pod holds goes (certificates revoked)."""
    def held(slice_name: str, uid: str) -> bool:
        r = kept.get(slice_name)
        return r is not None and r.served.uid == uid

    for v in servers:
        if not v.deleting and not held(v.slice_name, v.uid):
            out.actions.append(DeleteObject("Pod", v.name))
    for name, uid in services.items():
        slice_name = name.removeprefix("gpupool-slice-")
        if not held(slice_name, uid):
            out.actions.append(DeleteObject("Service", name))
    for c in credentials:
        if not held(c.slice_name, c.uid):
            out.revoke[c.serial] = c.expires_s
            if c.client_serial:
                out.revoke[c.client_serial] = c.client_expires_s
            if c.slice_name not in kept:  # else issued anew for its live pod this round
                out.actions.append(DeleteObject("Secret", slices.server_secret(c.slice_name)))


def _mark(r: RemotePod, status: SliceStatus, now: float, out: SlicePlan) -> None:
    out.states[status.state.value] = out.states.get(status.state.value, 0) + 1
    before = r.status
    same = before is not None and (before.state, before.node, before.server, before.reason) == \
        (status.state, status.node, status.server, status.reason)
    if same:
        return
    changed = before is None or before.state is not status.state
    status = replace(status, since=iso(now) if changed or before is None else before.since)
    event = None
    if changed and status.state in EVENTS:
        reason, warning = EVENTS[status.state]
        event = (reason, _sentence(status), warning)
    out.actions.append(Mark(r.served, status, event))


def _sentence(status: SliceStatus) -> str:
    if status.state is SliceState.SERVING:
        return f"its GPU slice is served by {status.server} on {status.node}"
    return status.reason or status.state.value
