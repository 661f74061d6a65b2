"""``KubeApi``: every Kubernetes API call gpupool makes, through the lightkube client.

This is the only module that talks to the Kubernetes API, and every call goes
through one maintained client: the lists, the watches, the writes, and the
Binding and GPULedger compare-and-swap on the extender's bind path are all made
by one lightkube client per ``KubeApi`` (httpx underneath, one pool of kept-alive
connections), on the transport ``gpupool.kube.connection.ApiTransport`` (httpx's
own, plus TCP keep-alive, bounded watch reads and a ``close`` that ends them). The bind
path's Binding and GPULedger read and compare-and-swap skip lightkube's request building
and answer decoding (``gpupool.kube.wire``: the same requests, on the same httpx client).
lightkube reads the configuration and sets up TLS and the credentials: a token,
the in-cluster service account's token file (read again after a 401, when the
kubelet has rotated it), an exec plugin, a client certificate, basic auth.

Core kinds come back as lightkube's typed models (``Pod``, ``Node``); the gpupool
custom resources (``GPUDevice``, ``ResourceClass``, ``ResourceGroup``,
``GPULedger``) come back as plain dicts (lightkube generic resources, which
subclass ``dict``). Failures raise the ``gpupool.kube.errors`` tree (``Conflict``
for a failed resourceVersion precondition; ``code`` 0 when nothing answered),
never lightkube or httpx exceptions; the exception is a credential plugin or TLS
file that cannot be used at all, which raises ``OSError`` / ``ValueError`` as
lightkube does (``gpupool.cli`` names the configuration in its message).

Watches yield ``(event_type, object)`` until the caller stops reading, the
``KubeApi`` is closed (the watch then fails with ``KubeError``) or the watch
fails: each request asks the server to end it after ``timeout_s``, lightkube then
asks again from the last resourceVersion seen, and a watch the server stops
answering fails ``timeout_s`` plus a margin after its last byte (``connection``).
``gpupool.kube.informer`` turns list + watch into a resilient feed. Calls may
come from many threads; a thread that watches takes a ``fork()``, so that
closing it ends only its own watch.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import httpx2
import lightkube
import msgspec
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.core.decoders import decode_list, decode_object
from lightkube.core.exceptions import ConfigError, NotReadyError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Node, Pod, Secret
from lightkube.types import PatchType

from gpupool.contract import names
from gpupool.kube import kubeconfig as kubeconfig_rules
from gpupool.kube.connection import WATCH_MARGIN_S, ApiTransport, tls_context
from gpupool.kube.errors import KubeError, from_status
from gpupool.kube.summaries import PodSummary
from gpupool.kube.wire import MERGE_PATCH, Wire

log = logging.getLogger(__name__)
T = TypeVar("T")
KubeObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    """The objects of a list call and the resourceVersion to watch from."""

    items: list[T]
    resource_version: str

_V = names.API_VERSION.split("/")[1]
GPUDevice = create_global_resource(names.GROUP, _V, "GPUDevice", "gpudevices")
ResourceClass = create_global_resource(names.GROUP, _V, "ResourceClass", "resourceclasses")
ResourceGroup = create_global_resource(names.GROUP, _V, "ResourceGroup", "resourcegroups")
GPULedger = create_global_resource(names.GROUP, _V, "GPULedger", "gpuledgers")
_LEDGERS = ("apis", names.GROUP, _V, "gpuledgers")  # the path of GPULedgers (``Wire``)
TenantQuota = create_global_resource(names.GROUP, _V, "TenantQuota", "tenantquotas")
GPUPermission = create_global_resource(names.GROUP, _V, "GPUPermission", "gpupermissions")
PodGroup = create_namespaced_resource(names.PODGROUP_GROUP, names.PODGROUP_VERSION, "PodGroup",
                                      "podgroups")

FIELD_MANAGER = "gpupool"
LABEL_NODE = names.LABEL_NODE  # GPUDevice label: the node the GPU is in
LABEL_MODEL = names.LABEL_MODEL  # GPUDevice label: the GPU model


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn lightkube / httpx failures into ``KubeError``s that say what was attempted."""
    try:
        yield
    except lightkube.ApiError as exc:
        raise _api_error(exc, what) from None
    except httpx2.HTTPStatusError as exc:  # an error answer that is not JSON
        raise _answer_error(exc.response, what) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise KubeError(f"{what}: the answer is not what the API serves ({exc})") from None
    except ConfigError as exc:
        raise KubeError(f"{what}: {exc}") from None
    except httpx2.ConnectTimeout as exc:
        raise KubeError(f"{what}: {_no_answer(exc)}") from None
    except httpx2.HTTPError as exc:
        raise KubeError(f"{what}: {type(exc).__name__}: {exc}") from None
    except RuntimeError as exc:  # httpx: the client was closed (``KubeApi.close``)
        raise KubeError(f"{what}: {exc}") from None
    except (KeyError, ValueError, TypeError) as exc:
        if isinstance(exc.__context__, httpx2.HTTPStatusError):  # lightkube could not read
            raise _answer_error(exc.__context__.response, what) from None  # an error answer
        raise


def _no_answer(exc: httpx2.ConnectTimeout) -> str:
    """``no answer from <server> within <n> s (...)``: which server and how long, instead of
    the SSL library's words."""
    try:
        url, limits = exc.request.url, exc.request.extensions.get("timeout", {})
    except RuntimeError:  # no request attached
        return f"no answer in time ({type(exc).__name__}: {exc})"
    seconds = limits.get("connect")
    within = f" within {seconds:g} s" if isinstance(seconds, int | float) else ""
    return (f"no answer from {url.scheme}://{url.netloc.decode()}{within} (connecting, TLS "
            "handshake included)")


def _api_error(exc: lightkube.ApiError, what: str) -> KubeError:
    """A ``Status`` error answer (or a watch's ERROR event, which has no HTTP status)."""
    st = exc.status
    code = int(st.code or 0) or (exc.response.status_code if exc.response is not None else 500)
    return from_status(code, st.reason or "", f"{what}: {st.message or f'HTTP {code}'}")


def _answer_error(response: httpx2.Response, what: str) -> KubeError:
    """An error answer that is not a ``Status``: its HTTP status and the start of its body."""
    body = b""
    with contextlib.suppress(httpx2.HTTPError, RuntimeError):
        body = response.read()
    code = response.status_code
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
        st = _STATUS(body)  # a Status served without its Content-Type
        if st.message:
            return from_status(code, st.reason, f"{what}: {st.message}")
    text = body[:200].decode("utf-8", "replace").strip()
    return from_status(code, "", f"{what}: HTTP {code}" + (f": {text}" if text else ""))


class _Status(msgspec.Struct):
    message: str = ""
    reason: str = ""


_STATUS = msgspec.json.Decoder(_Status).decode


_WARM_LOCK = threading.Lock()
_warmed = False


def warm_decoders() -> None:
    """Build msgspec's decoders for the typed resources once, on one thread.

    msgspec (under lightkube) was seen to crash the process when two threads
    decode the same type for the first time at once; every ``KubeApi`` calls this
    before any of its watch threads can start, so first decodes never race.
    """
    global _warmed
    with _WARM_LOCK:
        if _warmed:
            return
        sample = b'{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"w"}}]}'
        for res in (Pod, PodSummary, Node):
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                decode_list(sample, res)
                decode_object(b'{"metadata":{"name":"w"}}', res)
        _warmed = True


class KubeApi:
    """Typed calls on one lightkube client (``client``: one pool of HTTP connections)."""

    def __init__(self, config: KubeConfig, timeout_s: float = 10.0, trust_env: bool = True,
                 *, watch_margin_s: float = WATCH_MARGIN_S):
        """``timeout_s``: connect, write and read timeout of every request (a watch's reads:
        its ``timeout_s`` plus ``watch_margin_s``, at least this); ``trust_env``: honour
        ``SSL_CERT_FILE`` and the proxy variables. A configuration lightkube refuses (an
        auth-provider, no current context) raises ``KubeError`` here, at the start."""
        self._open(config, timeout_s, trust_env, watch_margin_s, None)

    def _open(self, config: KubeConfig, timeout_s: float, trust_env: bool,
              watch_margin_s: float, tls: ssl.SSLContext | None) -> None:
        warm_decoders()
        self._config, self._timeout_s, self._trust_env = config, timeout_s, trust_env
        self._watch_margin_s = watch_margin_s
        with _translated("connect to the Kubernetes API"):
            single = config.get()
            if single is None:
                raise ConfigError("the configuration names no current context")
            self._tls = tls or tls_context(single, trust_env)
            transport = ApiTransport.for_config(single, timeout_s, trust_env, watch_margin_s,
                                                self._tls)
            self.client = lightkube.Client(single, timeout=httpx2.Timeout(timeout_s),
                                           field_manager=FIELD_MANAGER, trust_env=trust_env,
                                           transport=transport)
            self._wire = Wire.of(self.client)

    @classmethod
    def connect(cls, kubeconfig: str | None = None, server: str | None = None,
                timeout_s: float = 10.0) -> KubeApi:
        """From a kubeconfig file, a bare server URL (tests), or the in-cluster account."""
        if server:
            # from_one with an empty user: lightkube's from_server leaves the user unset
            config = KubeConfig.from_one(cluster=Cluster(server=server), user=User())
            return cls(config, timeout_s, trust_env=False)
        # kubectl's rules: --kubeconfig, KUBECONFIG, ~/.kube/config, the service account;
        # a configuration that cannot be used or a server that cannot be reached is a
        # KubeconfigError (one line) here, at the start
        loaded = kubeconfig_rules.load(kubeconfig)
        kubeconfig_rules.reach(loaded)
        return cls(loaded.config, timeout_s)

    def fork(self) -> KubeApi:
        """A new connection pool with the same configuration and TLS context, of the same
        class (for a watch thread: closing it ends only its own calls)."""
        api = type(self).__new__(type(self))
        api._open(self._config, self._timeout_s, self._trust_env, self._watch_margin_s,
                  self._tls)
        return api

    def close(self) -> None:
        """Close the connections; a watch blocked on one ends with a ``KubeError``, and
        calls after this raise ``KubeError``."""
        with contextlib.suppress(Exception):
            self.client.close()

    # -- generic helpers -------------------------------------------------------------------
    def _list(self, res: Any, what: str, *, labels: Mapping[str, Any] | None = None,
              fields: Mapping[str, Any] | None = None, namespace: str | None = None
              ) -> Listing[Any]:
        """Every object (page after page while the server hands out continue tokens)."""
        with _translated(f"list {what}"):
            kwargs: dict[str, Any] = {"labels": labels, "fields": fields}
            if res in (Pod, PodSummary):
                kwargs["namespace"] = namespace or lightkube.ALL_NS
            it = self.client.list(res, **kwargs)
            items = list(it)
        version = ""
        with contextlib.suppress(NotReadyError):  # a list answer without a resourceVersion
            version = it.resourceVersion
        return Listing(items, version)

    def _watch(self, res: Any, what: str, resource_version: str, timeout_s: int | None, *,
               labels: Mapping[str, Any] | None = None, fields: Mapping[str, Any] | None = None
               ) -> Iterator[tuple[str, Any]]:
        kwargs: dict[str, Any] = {"labels": labels, "fields": fields,
                                  "resource_version": resource_version or None,
                                  "server_timeout": timeout_s}
        if res in (Pod, PodSummary):
            kwargs["namespace"] = lightkube.ALL_NS
        with _translated(f"watch {what}"):
            yield from self.client.watch(res, **kwargs)

    # -- pods --------------------------------------------------------------------------------
    def list_pods(self, node: str | None = None, labels: Mapping[str, Any] | None = None
                  ) -> Listing[Pod]:
        """Pods of every namespace, optionally only those bound to ``node``."""
        fields = {"spec.nodeName": node} if node else None
        return self._list(Pod, "pods", labels=labels, fields=fields)

    def list_pod_summaries(self, node: str | None = None) -> Listing[PodSummary]:
        """Like ``list_pods``, decoded as the much lighter ``PodSummary``."""
        fields = {"spec.nodeName": node} if node else None
        return self._list(PodSummary, "pods", fields=fields)

    def watch_pod_summaries(self, resource_version: str, node: str | None = None,
                            timeout_s: int | None = None) -> Iterator[tuple[str, PodSummary]]:
        fields = {"spec.nodeName": node} if node else None
        return self._watch(PodSummary, "pods", resource_version, timeout_s, fields=fields)

    def watch_pods(self, resource_version: str, node: str | None = None,
                   timeout_s: int | None = None) -> Iterator[tuple[str, Pod]]:
        fields = {"spec.nodeName": node} if node else None
        return self._watch(Pod, "pods", resource_version, timeout_s, fields=fields)

    def get_pod(self, namespace: str, name: str) -> Pod:
        with _translated(f"get pod {namespace}/{name}"):
            return self.client.get(Pod, name, namespace=namespace)

    def get_pod_json(self, namespace: str, name: str) -> KubeObject:
        """The pod as plain decoded JSON (the shape kube-scheduler sends)."""
        result: KubeObject = msgspec.to_builtins(self.get_pod(namespace, name))
        return result

    def patch_pod_annotations(self, namespace: str, name: str,
                              annotations: Mapping[str, str | None],
                              resource_version: str | None = None) -> Pod:
        """Merge ``annotations`` (None deletes a key); with ``resource_version`` the patch
        applies only to that version, else ``Conflict``."""
        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        with _translated(f"annotate pod {namespace}/{name}"):
            return self.client.patch(Pod, name, {"metadata": meta}, namespace=namespace,
                                     patch_type=PatchType.MERGE)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str,
                 annotations: Mapping[str, str] | None = None) -> None:
        """Create the pod's Binding; the API server copies ``annotations`` onto the pod in
        the same write. ``Conflict`` if the pod is already bound or is another pod."""
        what = f"bind pod {namespace}/{name} to {node}"
        url = self._url(("api", "v1", "namespaces"), (namespace, "pods", name, "binding"),
                        write=True)
        if url is not None and self._wire is not None:
            meta: dict[str, Any] = {"name": name, "namespace": namespace}
            if uid:
                meta["uid"] = uid
            if annotations:
                meta["annotations"] = dict(annotations)
            body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
            with _translated(what):
                self._wire.send("POST", url, body)  # the answer (a Status) is not read
            return
        binding = Pod.Binding(
            metadata=ObjectMeta(name=name, namespace=namespace, uid=uid or None,
                                annotations=dict(annotations) if annotations else None),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node))
        # success answers a Status, which lightkube tries to read as a Binding
        with (_translated(what), contextlib.suppress(msgspec.ValidationError)):
            self.client.create(binding, name=name, namespace=namespace)

    # -- nodes ---------------------------------------------------------------------------------
    def list_nodes(self) -> Listing[Node]:
        return self._list(Node, "nodes")

    def watch_nodes(self, resource_version: str, timeout_s: int | None = None
                    ) -> Iterator[tuple[str, Node]]:
        return self._watch(Node, "nodes", resource_version, timeout_s)

    def get_node(self, name: str) -> Node:
        with _translated(f"get node {name}"):
            return self.client.get(Node, name)

    # -- GPUDevice -------------------------------------------------------------------------------
    def list_gpu_devices(self, node: str | None = None) -> Listing[KubeObject]:
        labels = {LABEL_NODE: node} if node else None
        return self._list(GPUDevice, "GPUDevices", labels=labels)

    def watch_gpu_devices(self, resource_version: str, node: str | None = None,
                          timeout_s: int | None = None) -> Iterator[tuple[str, KubeObject]]:
        labels = {LABEL_NODE: node} if node else None
        return self._watch(GPUDevice, "GPUDevices", resource_version, timeout_s, labels=labels)

    def get_gpu_device(self, name: str) -> KubeObject:
        with _translated(f"get GPUDevice {name}"):
            return dict(self.client.get(GPUDevice, name))

    def create_gpu_device(self, obj: Mapping[str, Any]) -> KubeObject:
        with _translated(f"create GPUDevice {_name(obj)}"):
            return dict(self.client.create(GPUDevice.from_dict(dict(obj))))

    def update_gpu_device(self, obj: Mapping[str, Any]) -> KubeObject:
        """Replace the object (``metadata.resourceVersion``, when set, is a precondition)."""
        with _translated(f"update GPUDevice {_name(obj)}"):
            return dict(self.client.replace(GPUDevice.from_dict(dict(obj))))

    def patch_gpu_device_status(self, name: str, status: Mapping[str, Any]) -> KubeObject:
        with _translated(f"patch status of GPUDevice {name}"):
            return dict(self.client.patch(GPUDevice.Status, name, {"status": dict(status)},
                                          patch_type=PatchType.MERGE))

    def delete_gpu_device(self, name: str) -> None:
        with _translated(f"delete GPUDevice {name}"):
            self.client.delete(GPUDevice, name)

    # -- ResourceClass / ResourceGroup -----------------------------------------------------------
    def list_resource_classes(self) -> Listing[KubeObject]:
        return self._list(ResourceClass, "ResourceClasses")

    def watch_resource_classes(self, resource_version: str, timeout_s: int | None = None
                               ) -> Iterator[tuple[str, KubeObject]]:
        return self._watch(ResourceClass, "ResourceClasses", resource_version, timeout_s)

    def list_resource_groups(self) -> Listing[KubeObject]:
        return self._list(ResourceGroup, "ResourceGroups")

    def watch_resource_groups(self, resource_version: str, timeout_s: int | None = None
                              ) -> Iterator[tuple[str, KubeObject]]:
        return self._watch(ResourceGroup, "ResourceGroups", resource_version, timeout_s)

    # -- GPULedger (the per-node compare-and-swap record; docs/design/extender.md) -------------
    def list_ledgers(self) -> Listing[KubeObject]:
        return self._list(GPULedger, "GPULedgers")

    def watch_ledgers(self, resource_version: str, timeout_s: int | None = None
                      ) -> Iterator[tuple[str, KubeObject]]:
        return self._watch(GPULedger, "GPULedgers", resource_version, timeout_s)

    def _url(self, path: tuple[str, ...], names: tuple[str, ...], write: bool
             ) -> httpx2.URL | None:
        """The bind path's URL (``Wire.url``); None: send through lightkube."""
        return self._wire.url(path, names, write) if self._wire is not None else None

    def get_ledger(self, node: str) -> KubeObject:
        with _translated(f"get GPULedger {node}"):
            url = self._url(_LEDGERS, (node,), write=False)
            if url is not None and self._wire is not None:
                return self._wire.decoded(self._wire.send("GET", url))
            return dict(self.client.get(GPULedger, node))

    def create_ledger(self, obj: Mapping[str, Any]) -> KubeObject:
        with _translated(f"create GPULedger {_name(obj)}"):
            return dict(self.client.create(GPULedger.from_dict(dict(obj))))

    def patch_ledger(self, node: str, patch: Mapping[str, Any],
                     resource_version: str | None) -> KubeObject:
        """Merge-patch the ledger; with ``resource_version`` only if it is still current."""
        body = versioned(patch, resource_version)
        with _translated(f"update GPULedger {node}"):
            url = self._url(_LEDGERS, (node,), write=True)
            if url is not None and self._wire is not None:
                return self._wire.decoded(self._wire.send("PATCH", url, body, MERGE_PATCH))
            return dict(self.client.patch(GPULedger, node, body, patch_type=PatchType.MERGE))


    # -- Secrets and ConfigMaps (gpupool's own keys and certificates) ------------------------
    def get_secret_data(self, namespace: str, name: str) -> tuple[dict[str, str], str]:
        """(data, resourceVersion) of a Secret, values base64-decoded to text."""
        with _translated(f"get Secret {namespace}/{name}"):
            obj = self.client.get(Secret, name, namespace=namespace)
        try:
            data = {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
        except (ValueError, UnicodeDecodeError) as exc:
            raise KubeError(f"Secret {namespace}/{name}: data is not base64 text ({exc})"
                            ) from None
        return data, (obj.metadata.resourceVersion if obj.metadata else None) or ""

    def put_secret_data(self, namespace: str, name: str, data: Mapping[str, str],
                        resource_version: str | None, secret_type: str = "Opaque") -> str:
        """Create the Secret (``resource_version`` None) or replace its data at that
        version (``Conflict`` if it moved); returns the new resourceVersion."""
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        meta = ObjectMeta(name=name, namespace=namespace, resourceVersion=resource_version,
                          labels={"app.kubernetes.io/part-of": "gpupool"})
        body = Secret(metadata=meta, data=encoded, type=secret_type)
        verb = "create" if resource_version is None else "update"
        with _translated(f"{verb} Secret {namespace}/{name}"):
            done = self.client.create(body) if resource_version is None else \
                self.client.replace(body)
        return (done.metadata.resourceVersion if done.metadata else None) or ""

    def get_config_map_data(self, namespace: str, name: str) -> tuple[dict[str, str], str]:
        """(data, resourceVersion) of a ConfigMap."""
        with _translated(f"get ConfigMap {namespace}/{name}"):
            obj = self.client.get(ConfigMap, name, namespace=namespace)
        return dict(obj.data or {}), (obj.metadata.resourceVersion if obj.metadata else None) or ""

    def put_config_map_data(self, namespace: str, name: str, data: Mapping[str, str],
                            resource_version: str | None) -> str:
        """Create (``resource_version`` None) or replace at that version, like
        ``put_secret_data``."""
        meta = ObjectMeta(name=name, namespace=namespace, resourceVersion=resource_version,
                          labels={"app.kubernetes.io/part-of": "gpupool"})
        body = ConfigMap(metadata=meta, data=dict(data))
        verb = "create" if resource_version is None else "update"
        with _translated(f"{verb} ConfigMap {namespace}/{name}"):
            done = self.client.create(body) if resource_version is None else \
                self.client.replace(body)
        return (done.metadata.resourceVersion if done.metadata else None) or ""

    # -- the node agent: Events about pods, evictions -----------------------------------------
    def create_pod_event(self, pod_namespace: str, pod_name: str, pod_uid: str, reason: str,
                         message: str, warning: bool, component: str, host: str,
                         now: datetime) -> None:
        """A core/v1 Event about a pod (what ``kubectl describe pod`` lists), named as
        client-go's recorder names them: ``<pod>.<nanoseconds in hex>``."""
        name = f"{pod_name}.{int(now.timestamp() * 1e9):x}"
        event = Event(
            metadata=ObjectMeta(name=name, namespace=pod_namespace),
            involvedObject=ObjectReference(apiVersion="v1", kind="Pod", namespace=pod_namespace,
                                           name=pod_name, uid=pod_uid or None),
            reason=reason, message=message[:1024], type="Warning" if warning else "Normal",
            source=EventSource(component=component, host=host), count=1,
            firstTimestamp=now, lastTimestamp=now, reportingComponent=component,
            reportingInstance=host)
        with _translated(f"create Event about pod {pod_namespace}/{pod_name}"):
            self.client.create(event, namespace=pod_namespace)

    def create_device_event(self, name: str, uid: str, reason: str, message: str,
                            warning: bool, component: str, host: str, now: datetime) -> None:
        """A core/v1 Event about a GPUDevice (``kubectl describe gpudevice`` lists it). The
        object is cluster-scoped, so the Event is in ``default``, as client-go's recorder
        puts Events about cluster-scoped objects."""
        event = Event(
            metadata=ObjectMeta(name=f"{name}.{int(now.timestamp() * 1e9):x}",
                                namespace="default"),
            involvedObject=ObjectReference(apiVersion=names.API_VERSION, kind="GPUDevice",
                                           name=name, uid=uid or None),
            reason=reason, message=message[:1024], type="Warning" if warning else "Normal",
            source=EventSource(component=component, host=host), count=1,
            firstTimestamp=now, lastTimestamp=now, reportingComponent=component,
            reportingInstance=host)
        with _translated(f"create Event about GPUDevice {name}"):
            self.client.create(event, namespace="default")

    def evict_pod(self, namespace: str, name: str) -> None:
        """Ask the Eviction API (policy/v1) to evict the pod; it honours PodDisruptionBudgets
        (refused with HTTP 429 while a budget allows no disruption)."""
        eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        # success answers a Status, which lightkube tries to read as an Eviction
        with (_translated(f"evict pod {namespace}/{name}"),
              contextlib.suppress(msgspec.ValidationError)):
            self.client.create(eviction, name=name, namespace=namespace)

    # -- PodDisruptionBudgets (the extender's preemption honours them) -----------------------
    def list_disruption_budgets(self) -> Listing[KubeObject]:
        """PodDisruptionBudgets (policy/v1) of every namespace, as plain dicts."""
        from lightkube.resources.policy_v1 import PodDisruptionBudget
        with _translated("list PodDisruptionBudgets"):
            it = self.client.list(PodDisruptionBudget, namespace=lightkube.ALL_NS)
            items = [pdb.to_dict() for pdb in it]
            return Listing(items, it._resourceVersion or "")

    def watch_disruption_budgets(self, resource_version: str, timeout_s: int | None = None
                                 ) -> Iterator[tuple[str, KubeObject]]:
        from lightkube.resources.policy_v1 import PodDisruptionBudget
        with _translated("watch PodDisruptionBudgets"):
            for kind, pdb in self.client.watch(PodDisruptionBudget, namespace=lightkube.ALL_NS,
                                               resource_version=resource_version or None,
                                               server_timeout=timeout_s):
                yield kind, pdb.to_dict()

    def evict_pod_of(self, namespace: str, name: str, uid: str) -> None:
        """``evict_pod`` only if the pod named so is still the one of ``uid`` (a pod
        deleted and created again under the name is not evicted: 409 ``Conflict``)."""
        from lightkube.models.meta_v1 import DeleteOptions, Preconditions
        eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace),
                                deleteOptions=DeleteOptions(preconditions=Preconditions(uid=uid)))
        with (_translated(f"evict pod {namespace}/{name}"),
              contextlib.suppress(msgspec.ValidationError)):
            self.client.create(eviction, name=name, namespace=namespace)

    # -- TenantQuota / GPUPermission (tenancy: docs/tenancy.md) ---------------------------------
    def list_tenant_quotas(self) -> Listing[KubeObject]:
        return self._list(TenantQuota, "TenantQuotas")

    def watch_tenant_quotas(self, resource_version: str, timeout_s: int | None = None
                            ) -> Iterator[tuple[str, KubeObject]]:
        return self._watch(TenantQuota, "TenantQuotas", resource_version, timeout_s)

    def list_gpu_permissions(self) -> Listing[KubeObject]:
        return self._list(GPUPermission, "GPUPermissions")

    def watch_gpu_permissions(self, resource_version: str, timeout_s: int | None = None
                              ) -> Iterator[tuple[str, KubeObject]]:
        return self._watch(GPUPermission, "GPUPermissions", resource_version, timeout_s)

    def patch_tenant_quota_status(self, name: str, patch: Mapping[str, Any]) -> KubeObject:
        """Merge-patch a TenantQuota's ``status`` (``None`` values delete keys)."""
        with _translated(f"patch status of TenantQuota {name}"):
            return dict(self.client.patch(TenantQuota.Status, name, {"status": dict(patch)},
                                          patch_type=PatchType.MERGE))

    def list_namespaces(self) -> Listing[Namespace]:
        """Namespaces (their labels: a TenantQuota's ``namespaceSelector``)."""
        return self._list(Namespace, "namespaces")

    def watch_namespaces(self, resource_version: str, timeout_s: int | None = None
                         ) -> Iterator[tuple[str, Namespace]]:
        return self._watch(Namespace, "namespaces", resource_version, timeout_s)

    def patch_gpu_permission_status(self, name: str, patch: Mapping[str, Any]) -> KubeObject:
        with _translated(f"patch status of GPUPermission {name}"):
            return dict(self.client.patch(GPUPermission.Status, name, {"status": dict(patch)},
                                          patch_type=PatchType.MERGE))

    # -- QuotaLedger (the per-quota-scope compare-and-swap record; docs/protocol.md) ----------
    def list_quota_ledgers(self) -> Listing[KubeObject]:
        return self._list(QuotaLedger, "QuotaLedgers")

    def get_quota_ledger(self, name: str) -> KubeObject:
        with _translated(f"get QuotaLedger {name}"):
            return dict(self.client.get(QuotaLedger, name))

    def create_quota_ledger(self, obj: Mapping[str, Any]) -> KubeObject:
        with _translated(f"create QuotaLedger {_name(obj)}"):
            return dict(self.client.create(QuotaLedger.from_dict(dict(obj))))

    def patch_quota_ledger(self, name: str, patch: Mapping[str, Any],
                           resource_version: str | None) -> KubeObject:
        """Merge-patch the ledger; with ``resource_version`` only if it is still current."""
        with _translated(f"update QuotaLedger {name}"):
            return dict(self.client.patch(QuotaLedger, name, versioned(patch, resource_version),
                                          patch_type=PatchType.MERGE))

    # -- PodGroups (scheduling.k8s.io/v1alpha2: gangs, docs/gangs.md) -----------------------
    def list_pod_groups(self) -> Listing[KubeObject]:
        """PodGroups of every namespace (404 where the cluster lacks the PodGroup API)."""
        with _translated("list PodGroups"):
            it = self.client.list(PodGroup, namespace=lightkube.ALL_NS)
            items = [dict(o) for o in it]
        return Listing(items, it._resourceVersion or "")

    def watch_pod_groups(self, resource_version: str, timeout_s: int | None = None
                         ) -> Iterator[tuple[str, KubeObject]]:
        with _translated("watch PodGroups"):
            for kind, obj in self.client.watch(PodGroup, namespace=lightkube.ALL_NS,
                                               resource_version=resource_version or None,
                                               server_timeout=timeout_s):
                yield kind, dict(obj)


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name", "?")) if isinstance(meta, Mapping) else "?"


# -- Dynamic Resource Allocation (resource.k8s.io/v1) ---------------------------------------------
# Read and written as plain dicts (generic resources) so that fields newer than the installed
# lightkube models (consumable capacity, device taints, extendedResourceName) pass through.
_DRA_GROUP, _DRA_VERSION = "resource.k8s.io", "v1"
ResourceSliceV1 = create_global_resource(_DRA_GROUP, _DRA_VERSION, "ResourceSlice",
                                         "resourceslices")
DeviceClassV1 = create_global_resource(_DRA_GROUP, _DRA_VERSION, "DeviceClass", "deviceclasses")
ResourceClaimV1 = create_namespaced_resource(_DRA_GROUP, _DRA_VERSION, "ResourceClaim",
                                             "resourceclaims")


def versioned(patch: Mapping[str, Any], resource_version: str | None) -> dict[str, Any]:
    """``patch`` that applies only while the object's resourceVersion is still
    ``resource_version`` (a merge patch carrying it; None: unconditional)."""
    body = dict(patch)
    if resource_version is not None:
        body["metadata"] = {**dict(body.get("metadata") or {}),
                            "resourceVersion": resource_version}
    return body


class DraApi(KubeApi):
    """``KubeApi`` plus the DRA objects: ResourceSlices (node agent), DeviceClasses
    (controller), ResourceClaims (read only)."""

    def list_resource_slices(self, node: str, driver: str) -> list[KubeObject]:
        """The ResourceSlices of ``driver`` on ``node`` (field selectors the API serves)."""
        fields: dict[str, Any] = {"spec.nodeName": node, "spec.driver": driver}
        with _translated(f"list ResourceSlices of {driver} on {node}"):
            return [dict(o) for o in self.client.list(ResourceSliceV1, fields=fields)]

    def create_resource_slice(self, obj: Mapping[str, Any]) -> KubeObject:
        with _translated(f"create ResourceSlice {_name(obj)}"):
            return dict(self.client.create(ResourceSliceV1.from_dict(dict(obj))))

    def replace_resource_slice(self, obj: Mapping[str, Any]) -> KubeObject:
        """Replace (``metadata.resourceVersion``, when set, is a precondition)."""
        with _translated(f"update ResourceSlice {_name(obj)}"):
            return dict(self.client.replace(ResourceSliceV1.from_dict(dict(obj))))

    def delete_resource_slice(self, name: str) -> None:
        with _translated(f"delete ResourceSlice {name}"):
            self.client.delete(ResourceSliceV1, name)

    def get_resource_claim(self, namespace: str, name: str) -> KubeObject:
        with _translated(f"get ResourceClaim {namespace}/{name}"):
            return dict(self.client.get(ResourceClaimV1, name, namespace=namespace))

    def list_device_classes(self) -> list[KubeObject]:
        with _translated("list DeviceClasses"):
            return [dict(o) for o in self.client.list(DeviceClassV1)]

    def create_device_class(self, obj: Mapping[str, Any]) -> KubeObject:
        with _translated(f"create DeviceClass {_name(obj)}"):
            return dict(self.client.create(DeviceClassV1.from_dict(dict(obj))))

    def replace_device_class(self, obj: Mapping[str, Any]) -> KubeObject:
        with _translated(f"update DeviceClass {_name(obj)}"):
            return dict(self.client.replace(DeviceClassV1.from_dict(dict(obj))))

    def delete_device_class(self, name: str) -> None:
        with _translated(f"delete DeviceClass {name}"):
            self.client.delete(DeviceClassV1, name)

    # -- what the scheduler extender watches (every node's slices, every namespace's claims) --
    def list_all_resource_slices(self) -> Listing[KubeObject]:
        """Every ResourceSlice (all drivers: the reader keeps gpupool's)."""
        with _translated("list ResourceSlices"):
            it = self.client.list(ResourceSliceV1)
            items = [dict(o) for o in it]
        return Listing(items, it._resourceVersion or "")

    def watch_resource_slices(self, resource_version: str, timeout_s: int | None = None
                              ) -> Iterator[tuple[str, KubeObject]]:
        with _translated("watch ResourceSlices"):
            for kind, obj in self.client.watch(ResourceSliceV1,
                                               resource_version=resource_version or None,
                                               server_timeout=timeout_s):
                yield kind, dict(obj)

    def list_resource_claims(self) -> Listing[KubeObject]:
        """ResourceClaims of every namespace."""
        with _translated("list ResourceClaims"):
            it = self.client.list(ResourceClaimV1, namespace=lightkube.ALL_NS)
            items = [dict(o) for o in it]
        return Listing(items, it._resourceVersion or "")

    def watch_resource_claims(self, resource_version: str, timeout_s: int | None = None
                              ) -> Iterator[tuple[str, KubeObject]]:
        with _translated("watch ResourceClaims"):
            for kind, obj in self.client.watch(ResourceClaimV1, namespace=lightkube.ALL_NS,
                                               resource_version=resource_version or None,
                                               server_timeout=timeout_s):
                yield kind, dict(obj)


QuotaLedger = create_global_resource(names.GROUP, _V, "QuotaLedger", "quotaledgers")
