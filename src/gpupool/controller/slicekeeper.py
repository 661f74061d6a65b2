"""Remote GPU slices' writes: ``SliceKeeper.keep`` reads what serves each slice, asks
``slicesplan.plan`` what to do, and does it (docs/remote.md, docs/design/remote.md).

* server pods come from the controller's pod informer (the slices' namespace, label
  ``app.kubernetes.io/component=slice-server``); Services and the servers' TLS Secrets
  are listed in the slices' namespace each round;
* certificates are issued from gpupool's session CA (Secret ``gpupool-slice-ca`` in
  the slices' namespace, made on first use): the server's into ``gpupool-slice-<slice>-server``
  there, the sidecar's into ``gpupool-slice-<slice>`` in the workload's namespace (owned by
  the workload's pod; written whole, never read: the server's Secret records its serial
  and expiry);
* revoked serials go into the revocation list (ConfigMap ``gpupool-slice-revocations``:
  ``crl.pem``, signed by the session CA, and ``revoked.json``, serial -> expiry), which
  the servers mount and read again; a serial leaves the list once its certificate has
  expired;
* the slice's state is written on the workload's pod (``gpupool.io/slice-status``) with an
  Event when it changes.

A failed write is logged and the plan made again next round from what is seen then.
Once the leader's term has ended (``ended``), nothing more is sent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpupool.contract import names, slices
from gpupool.contract.devices import parse_time
from gpupool.contract.slices import read_status
from gpupool.controller import podwrites
from gpupool.controller.observed import Observed
from gpupool.controller.sliceserver import REVOCATIONS, Served, ServerSettings
from gpupool.controller.slicesplan import (
    CreateObject,
    CredentialSeen,
    DeleteObject,
    Issue,
    Mark,
    RemotePod,
    ServerSeen,
    SlicePlan,
    Timing,
    plan,
)
from gpupool.core.errors import InvalidInput
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from gpupool.kube.slice_ops import Owner, SliceObjects
from gpupool.kube.tlsstore import ensure_ca
from gpupool.security import sessions
from gpupool.security.certs import PemPair

log = logging.getLogger(__name__)

SLICE_CA = "gpupool-slice-ca"
SELECTOR = {slices.LABEL_COMPONENT: slices.COMPONENT}

Report = Callable[[SlicePlan], None]


class SliceKeeper:
    def __init__(self, api: KubeApi, settings: ServerSettings, timing: Timing | None = None,
                 clock: Callable[[], float] = time.time, host: str = "",
                 report: Report | None = None):
        self.api = api
        self.objects = SliceObjects(api)
        self.settings = settings
        self.timing = timing or Timing()
        self.clock = clock
        self.host = host
        self.report = report

    def keep(self, observed: Observed, pods: Iterable[Mapping[str, Any]],
             devices: Iterable[Mapping[str, Any]], ended: threading.Event | None = None
             ) -> SlicePlan | None:
        """One round; the plan carried out (None: nothing could be listed)."""
        now = self.clock()
        pods = list(pods)
        remote = remote_pods(observed, pods)
        servers = server_pods(pods, self.settings.namespace)
        try:  # listed every round: what a failed round left (a Secret kept until its
            # serials are revoked, a Service) is found again once no pod is left
            services = self._services()
            credentials = self._credentials()
        except KubeError as exc:
            log.warning("remote slices: listing their objects failed (retried next round): "
                        "%s", exc)
            return None
        if not (remote or servers or services or credentials):
            return None
        done = plan(remote, servers, services, credentials, isolation_of(devices),
                    self.settings, now, self.timing)
        self._apply(done, now, ended, {c.slice_name: c for c in credentials})
        if self.report is not None:
            self.report(done)
        return done

    # -- reading --------------------------------------------------------------------------
    def _services(self) -> dict[str, str]:
        out = {}
        for svc in self.objects.list_json("Service", self.settings.namespace, SELECTOR):
            meta = svc.get("metadata") or {}
            out[str(meta.get("name"))] = str((meta.get("labels") or {}).get(
                slices.LABEL_POD_UID, ""))
        return out

    def _credentials(self) -> list[CredentialSeen]:
        out = []
        for sec in self.objects.secrets(self.settings.namespace, SELECTOR):
            try:
                cred = sessions.credential_of(sec.data.get("tls.crt", ""))
            except InvalidInput:
                cred = None
            notes = sec.annotations
            out.append(CredentialSeen(
                str(sec.labels.get(slices.LABEL_SLICE, "")),
                str(sec.labels.get(slices.LABEL_POD_UID, "")),
                cred.serial if cred is not None else 0,
                cred.not_after if cred is not None else 0.0,
                _hex(notes.get(slices.ANNOTATION_CLIENT_SERIAL)),
                _float(notes.get(slices.ANNOTATION_CLIENT_EXPIRES))))
        return out

    # -- writing --------------------------------------------------------------------------
    def _apply(self, done: SlicePlan, now: float, ended: threading.Event | None,
               held: Mapping[str, CredentialSeen]) -> None:
        ca: PemPair | None = None
        issued = {k: (c.client_serial, c.client_expires_s) for k, c in held.items()
                  if c.client_serial}
        revoked = True
        if done.revoke and not (ended is not None and ended.is_set()):
            # first: a server Secret is the only record of its serials, so it goes only
            # once they are in the revocation list
            try:
                ca = ensure_ca(self.api, self.settings.namespace, now, SLICE_CA)
                self._revoke(done.revoke, ca, now)
            except KubeError as exc:
                revoked = False
                log.warning("remote slices: the revocation list was not written; the "
                            "Secrets of released slices are kept until it is (retried next "
                            "round): %s", exc)
        for action in done.actions:
            if ended is not None and ended.is_set():
                log.warning("the leader's term ended: remote slices' writes stop this round")
                return
            if not revoked and isinstance(action, DeleteObject) and action.kind == "Secret":
                continue
            try:
                if isinstance(action, Issue):
                    ca = ca or ensure_ca(self.api, self.settings.namespace, now, SLICE_CA)
                    self._issue(action, ca, now, issued)
                else:
                    self._write(action, now)
            except KubeError as exc:
                log.warning("remote slices: %s (retried next round)", exc)

    def _write(self, action: CreateObject | DeleteObject | Mark, now: float) -> None:
        ns = self.settings.namespace
        if isinstance(action, CreateObject):
            if action.kind == "Pod":
                self._ensure_revocations(now)
            try:
                self.objects.create(action.kind, action.obj)
                log.info("remote slices: created %s %s/%s", action.kind, ns,
                         action.obj["metadata"]["name"])
            except AlreadyExists:
                pass
        elif isinstance(action, DeleteObject):
            try:
                self.objects.delete(action.kind, ns, action.name)
                log.info("remote slices: deleted %s %s/%s", action.kind, ns, action.name)
            except NotFound:
                pass
        else:
            self._mark(action, now)

    def _issue(self, action: Issue, ca: PemPair, now: float,
               issued: dict[str, tuple[int, float]]) -> None:
        s, life = action.served, self.timing.lifetime_s
        name = s.slice_name
        tagged = {**SELECTOR, "app.kubernetes.io/part-of": "gpupool",
                  slices.LABEL_SLICE: name, slices.LABEL_POD_UID: s.uid}
        if not action.client:
            dns = f"{slices.service_name(name)}.{self.settings.namespace}.svc"
            pair = sessions.issue_server(ca, s.uid, now, life, dns_names=[dns])
            notes = _client_notes(*issued[name]) if name in issued else {}  # the sidecar's
            self.objects.write_secret(self.settings.namespace, slices.server_secret(name),
                                      _tls(pair, ca), labels=tagged, annotations=notes)
            return
        pair = sessions.issue_client(ca, s.uid, now, life)
        cred = sessions.credential_of(pair.cert)
        self.objects.write_secret(s.namespace, slices.client_secret(name), _tls(pair, ca),
                                  labels={**tagged, slices.LABEL_COMPONENT: "slice-client"},
                                  owner=Owner("Pod", s.name, s.uid))
        issued[name] = (cred.serial, cred.not_after)
        with contextlib.suppress(NotFound):  # else written with the server's, later
            self.objects.annotate_secret(self.settings.namespace, slices.server_secret(name),
                                         _client_notes(cred.serial, cred.not_after))
        log.info("remote slices: issued the sidecar certificate of pod %s (serial %x)",
                 s.ref, cred.serial)

    def _mark(self, action: Mark, now: float) -> None:
        s = action.served
        try:
            self.api.patch_pod_annotations(s.namespace, s.name, {
                names.ANNOTATION_SLICE_STATUS: action.status.encode()})
        except NotFound:
            return
        if action.event is not None:
            reason, message, warning = action.event
            podwrites.tell(self.api, s.namespace, s.name, s.uid, reason, message, warning,
                           self.host, datetime.fromtimestamp(now, UTC))
        if action.event is not None and action.event[2]:
            log.warning("remote slices: pod %s: %s", s.ref, action.event[1])

    def _ensure_revocations(self, now: float) -> None:
        try:
            self.api.get_config_map_data(self.settings.namespace, REVOCATIONS)
        except NotFound:
            self._revoke({}, ensure_ca(self.api, self.settings.namespace, now, SLICE_CA), now)

    def _revoke(self, serials: Mapping[int, float], ca: PemPair, now: float) -> None:
        """Add ``serials`` to the revocation list (those expired leave it), by
        compare-and-swap on the ConfigMap."""
        ns = self.settings.namespace
        for _ in range(5):
            try:
                data, version = self.api.get_config_map_data(ns, REVOCATIONS)
            except NotFound:
                data, version = {}, ""
            known = {**_revoked(data.get("revoked.json", "")), **serials}
            kept = {k: v for k, v in known.items() if v > now}
            body = {"crl.pem": sessions.revocation_list(ca, kept, now),
                    "revoked.json": json.dumps({f"{k:x}": v for k, v in sorted(kept.items())})}
            try:
                self.api.put_config_map_data(ns, REVOCATIONS, body, version or None)
                return
            except (AlreadyExists, Conflict):
                continue
        raise KubeError(f"ConfigMap {ns}/{REVOCATIONS} kept changing while it was written")


def remote_pods(observed: Observed, pods: Iterable[Mapping[str, Any]]) -> list[RemotePod]:
    """The live pods whose counted decision is served by a slice server."""
    by_uid = {str(_meta(p).get("uid") or ""): p for p in pods}
    out = []
    for h in observed.holdings:
        pod = by_uid.get(h.key)
        if not h.allocation.served_by or pod is None or _meta(pod).get("deletionTimestamp"):
            continue
        meta = _meta(pod)
        notes = meta.get("annotations") or {}
        try:
            name = slices.checked_slice(notes.get(names.ANNOTATION_SLICE), h.pod)
        except InvalidInput:
            name = ""
        served = Served(h.key, str(meta.get("namespace") or "default"),
                        str(meta.get("name") or ""), name, h.allocation)
        out.append(RemotePod(served, read_status(notes), h.bound_s))
    return out


def server_pods(pods: Iterable[Mapping[str, Any]], namespace: str) -> list[ServerSeen]:
    """The slice server pods among ``pods`` (the slices' namespace, the component label)."""
    out = []
    for p in pods:
        meta = _meta(p)
        labels = meta.get("labels") or {}
        if meta.get("namespace") != namespace or \
                labels.get(slices.LABEL_COMPONENT) != slices.COMPONENT:
            continue
        name = str(meta.get("name") or "")
        generation = name.rsplit("-", 1)[-1]
        status = p.get("status") or {}
        ready = next((c for c in status.get("conditions") or []
                      if isinstance(c, Mapping) and c.get("type") == "Ready"), {})
        out.append(ServerSeen(
            name, str(labels.get(slices.LABEL_SLICE, "")),
            str(labels.get(slices.LABEL_POD_UID, "")),
            int(generation) if generation.isdigit() else 0,
            str((p.get("spec") or {}).get("nodeName") or ""),
            str((meta.get("annotations") or {}).get("gpupool.io/gpu", "")),
            str(status.get("phase") or "Pending"), ready.get("status") == "True",
            parse_time(ready.get("lastTransitionTime")),
            parse_time(meta.get("creationTimestamp")), bool(meta.get("deletionTimestamp")),
            _container_message(status)))
    return out


def isolation_of(devices: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """GPU uuid -> the isolation provider its node agent reports (GPUDevice status)."""
    out = {}
    for d in devices:
        uuid = (d.get("spec") or {}).get("uuid")
        provider = (d.get("status") or {}).get("isolationProvider")
        if isinstance(uuid, str) and isinstance(provider, str) and provider:
            out[uuid] = provider
    return out


def _container_message(status: Mapping[str, Any]) -> str:
    """Why the server's container waits or ended (its state's reason and message)."""
    for c in status.get("containerStatuses") or []:
        state = (c or {}).get("state") or {}
        for phase in ("terminated", "waiting"):
            s = state.get(phase)
            if isinstance(s, Mapping) and (s.get("reason") or s.get("message")):
                return ": ".join(str(x) for x in (s.get("reason"), s.get("message")) if x)[:300]
    return ""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _tls(pair: PemPair, ca: PemPair) -> dict[str, str]:
    return {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": ca.cert}


def _client_notes(serial: int, expires: float) -> dict[str, str]:
    return {slices.ANNOTATION_CLIENT_SERIAL: f"{serial:x}",
            slices.ANNOTATION_CLIENT_EXPIRES: f"{expires:.0f}"}


def _revoked(text: str) -> dict[int, float]:
    try:
        body = json.loads(text) if text else {}
        return {int(k, 16): float(v) for k, v in body.items()}
    except (ValueError, AttributeError, TypeError):
        return {}


def _hex(value: Any) -> int:
    try:
        return int(str(value), 16)
    except ValueError:
        return 0


def _float(value: Any) -> float:
    try:
        return float(str(value))
    except ValueError:
        return 0.0
