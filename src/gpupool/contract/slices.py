"""What the admission webhook, the controller and the slice processes agree on for a
remote GPU slice (docs/remote.md, docs/design/remote.md).

A ``remote-required`` or ``remote-allowed`` pod gets, at admission, a **slice name**
(``gpupool.io/slice``: 16 lowercase hex digits the webhook draws) that names everything of
its slice that must be known before the pod has a uid:

* the Service ``gpupool-slice-<slice>`` in the slices' namespace, in front of the slice
  server (its address is the sidecar's ``--slice-server``: a server placed again on
  another node answers on the same address);
* the TLS Secret ``gpupool-slice-<slice>`` in the pod's namespace, holding the sidecar's
  session certificate (the controller issues it once the pod is bound, bound to the
  pod's uid, and renews it), mounted by the sidecar;
* the slice server pod ``gpupool-slice-<slice>-<n>`` in the slices' namespace (``n``
  counts the servers of the slice: a slice placed again gets the next one), with its own
  TLS Secret ``gpupool-slice-<slice>-server``.

The controller writes what became of the server on the workload's pod
(``gpupool.io/slice-status``: ``SliceStatus``). Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpupool.contract import names
from gpupool.core.errors import InvalidInput

SIDECAR = "gpupool-slice-client"
"""The native sidecar the webhook injects (an init container, ``restartPolicy: Always``)."""
CREDENTIALS_VOLUME = "gpupool-slice-credentials"
CREDENTIALS_DIR = "/var/run/gpupool/slice"
SERVER_PORT = 14900  # the slice server's TLS port (its Service's too)
SERVER_STATUS_PORT = 14901  # the slice server's /healthz, /status, /usage
DATA_PORT = 14833  # the data plane on the workload's loopback (LUPINE's default port)
CLIENT_STATUS_PORT = 14834  # the sidecar's /ready and /status
LABEL_SLICE = "gpupool.io/slice"  # on the server pod, its Service's selector and Secrets
LABEL_POD_UID = "gpupool.io/pod-uid"  # the workload pod the object serves
LABEL_COMPONENT = "app.kubernetes.io/component"
ANNOTATION_CLIENT_SERIAL = "gpupool.io/client-serial"  # on the server's Secret: the sidecar's
ANNOTATION_CLIENT_EXPIRES = "gpupool.io/client-expires"  # certificate (hex; epoch seconds)
COMPONENT = "slice-server"
PROVIDERS = ("none", "stub", "lupine")
"""The data-plane providers a cluster may configure (``none``: no remote slices)."""
DECISION_ENV = "GPUPOOL_DECISION"
"""A ``remote-allowed`` pod's sidecar: its pod's ``gpupool.io/allocation``, from the
downward API (the sidecar idles when the decision is served by the pod's own node)."""
LUPINE_ENV = ("SCUDA_SERVER", "SCUDA_PORT")

_SLICE = re.compile(r"^[0-9a-f]{16}$")


def checked_slice(value: Any, where: str) -> str:
    """A slice name as the webhook draws it; ``InvalidInput`` names ``where``."""
    if not isinstance(value, str) or not _SLICE.match(value):
        raise InvalidInput(f"{where}: annotation {names.ANNOTATION_SLICE}={value!r} is not a "
                           "slice name (16 lowercase hex digits, written by gpupool's "
                           "admission webhook)")
    return value


def service_name(slice_name: str) -> str:
    return f"gpupool-slice-{slice_name}"


def client_secret(slice_name: str) -> str:
    """The sidecar's TLS Secret, in the workload's namespace."""
    return f"gpupool-slice-{slice_name}"


def server_secret(slice_name: str) -> str:
    """The slice server's TLS Secret, in the slices' namespace."""
    return f"gpupool-slice-{slice_name}-server"


def server_pod(slice_name: str, generation: int) -> str:
    return f"gpupool-slice-{slice_name}-{generation}"


def server_address(slice_name: str, namespace: str) -> str:
    """The sidecar's ``--slice-server``: the slice's Service, by its cluster DNS name."""
    return f"{service_name(slice_name)}.{namespace}.svc:{SERVER_PORT}"


def client_env(provider: str, lupine_preload: str = "") -> tuple[tuple[str, str], ...]:
    """What a workload's GPU container is told when its slice is served by a slice server:
    no GPU of its own node (``NVIDIA_VISIBLE_DEVICES=void``: the NVIDIA container runtime
    then behaves as runc, exposing neither GPUs nor driver libraries) and the provider's
    client pointed at the sidecar's data plane on loopback. The webhook writes these into a
    ``remote-required`` pod; the node agent answers them in Allocate for a ``remote-allowed``
    pod served remotely."""
    out = [("NVIDIA_VISIBLE_DEVICES", "void"), ("GPUPOOL_SLICE_PROVIDER", provider),
           ("GPUPOOL_SLICE_ADDRESS", f"127.0.0.1:{DATA_PORT}")]
    if provider == "lupine":
        out += [(LUPINE_ENV[0], "127.0.0.1"), (LUPINE_ENV[1], str(DATA_PORT))]
        if lupine_preload:
            out.append(("LD_PRELOAD", lupine_preload))
    return tuple(out)


class SliceState(StrEnum):
    STARTING = "starting"  # the server pod is made, not serving yet
    SERVING = "serving"
    LOST = "lost"  # the server stopped answering past the deadline: placed again if allowed
    FAILED = "failed"  # the server could not start; the reason says why
    UNSERVED = "unserved"  # no server can be made (no provider, a name taken, ...)


@dataclass(frozen=True, slots=True)
class SliceStatus:
    """``gpupool.io/slice-status`` on the workload's pod: what the controller saw of its
    slice server (``node``: the node it runs on; ``server``: its pod, namespace/name)."""

    state: SliceState
    node: str = ""
    server: str = ""
    reason: str = ""
    since: str = ""  # RFC 3339

    def encode(self) -> str:
        body = {"state": self.state.value, "node": self.node, "server": self.server,
                "reason": self.reason[:512], "since": self.since}
        return json.dumps({k: v for k, v in body.items() if v}, separators=(",", ":"),
                          sort_keys=True)


def read_status(annotations: Mapping[str, Any] | None) -> SliceStatus | None:
    """The pod's slice status (None: none written, or unreadable)."""
    raw = (annotations or {}).get(names.ANNOTATION_SLICE_STATUS)
    if not isinstance(raw, str):
        return None
    try:
        body = json.loads(raw)
        state = SliceState(body.get("state"))
    except (ValueError, AttributeError):
        return None
    text = {k: str(body.get(k) or "") for k in ("node", "server", "reason", "since")}
    return SliceStatus(state, **text)
