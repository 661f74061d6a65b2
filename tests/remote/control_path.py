"""A remote slice's whole control path on one machine, from a client pod's creation to its
slice usable: shared by ``test_control_path.py`` (once, with its release) and
``bench/bench_remote_start.py`` (timed per stage).

What is real: ``gpupool webhook`` (over HTTPS, its certificate from its own CA, trusted
through the caBundle it wrote), ``gpupool extender --remote-slices`` (over plain HTTP),
``gpupool controller --remote-provider stub`` (leader election included), and, started from
the pods the controller and the webhook wrote, ``gpupool slice-server --provider stub`` and
``gpupool slice-client``: each its own process, against the FAKE API server at ``url``.

Stand-ins, each named where it acts:

* **the API server's admission step** (``Driver.admit``): the fake API server calls no
  webhook, so the driver sends the AdmissionReviews (mutate, then validate) on one
  kept-alive HTTPS connection, applies the JSON patch and creates the pod (adding what the
  API server defaults: ``status.phase: Pending``);
* **kube-scheduler** (``Driver.schedule``): once the pod is seen on a watch, filter (the
  nodes matching its ``nodeSelector``), prioritize (more than one node passed), bind to the
  best; its queue, backoff and plugins are not modelled;
* **kubelet** (``Kubelet``): a container starts once its pod is on a node and the Secrets
  and ConfigMaps its volumes name exist; the volumes become directories of files, the
  ``$(VAR)`` references in the arguments are expanded from the container's environment
  (``fieldRef: metadata.uid`` included). The pods share the host's network here, so each
  pod's ports are mapped to free ones, ``--host``/``--status-address`` are set to loopback,
  and a Service's DNS name resolves to ``127.0.0.1`` and the port its selected pod's
  ``targetPort`` is mapped to. Container start latency (sandbox, image, runtime) and probe
  periods are not modelled: the driver polls the server's ``/healthz`` and the sidecar's
  ``/ready`` every few milliseconds;
* **the workload** is the driver itself, talking the stub protocol to the address its GPU
  container was given (``GPUPOOL_SLICE_ADDRESS``, mapped as the pod's ports are).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpupool.contract import names, slices
from gpupool.remote.stubclient import StubClient
from gpupool.webhook.review import Verdict
from tests.extender.builders import gpu_obj, node_obj
from tests.ports import free_port
from tests.webhook.builders import body, container, pod, review
from tests.webhook.test_remote import applied

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_NS, SLICES_NS, CLIENT_NS = "gpupool-system", "gpupool-slices", "bench"
CLIENT_NODE, GPU_NODE = "cpu-node-1", "gpu-node-1"
ROLE = "bench.gpupool.io/role"
IMAGE = "registry.example/gpupool:bench"
WEBHOOK_HOST = f"gpupool-webhook.{SYSTEM_NS}.svc"
PLURALS = {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
           "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}
PATIENCE_S = 60.0  # a hang guard, never a deadline a busy machine could miss
POLL_S = 0.003
Obj = dict[str, Any]


def seed_objects(gpus: int = 8) -> list[tuple[str, Obj]]:
    """The cluster: a node without GPUs (the client's, label ``ROLE=cpu``), a GPU node
    with ``gpus`` A100s (isolation provider ``none``: no node agent runs here, so their
    heartbeats are those of the seed), and the shipped webhook configurations."""
    out: list[tuple[str, Obj]] = [
        ("nodes", node_obj(CLIENT_NODE, labels={ROLE: "cpu",
                                                "kubernetes.io/hostname": CLIENT_NODE})),
        ("nodes", node_obj(GPU_NODE, labels={ROLE: "gpu", "kubernetes.io/hostname": GPU_NODE}))]
    for i in range(gpus):
        device = gpu_obj(GPU_NODE, i)
        device["status"]["isolationProvider"] = "none"
        out.append(("gpudevices", device))
    for doc in yaml.safe_load_all((ROOT / "deploy" / "webhook" / "webhooks.yaml").read_text()):
        if doc:
            out.append((PLURALS[doc["kind"]], doc))
    return out


def client_pod(name: str, mib: int = 1024, core: int = 10) -> Obj:
    """A ``remote-required`` pod as its author writes it, pinned to the node without GPUs."""
    obj = pod(name, CLIENT_NS, container(
        limits={names.RESOURCE_MEMORY: str(mib), names.RESOURCE_CORE: str(core)},
        requests={"cpu": "1", "memory": "1Gi"}),
        annotations={names.ANNOTATION_PLACEMENT: "remote-required"})
    obj["spec"]["nodeSelector"] = {ROLE: "cpu"}
    return obj


# -- the API, as a client sees it -------------------------------------------------------------
def path_of(plural: str, namespace: str | None = None, name: str | None = None) -> str:
    group = {"gpudevices": "/apis/gpupool.io/v1alpha1",
             "leases": "/apis/coordination.k8s.io/v1",
             **{p: "/apis/admissionregistration.k8s.io/v1" for p in PLURALS.values()}
             }.get(plural, "/api/v1")
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{group}{where}/{plural}" + (f"/{name}" if name else "")


@dataclass
class Seen:
    obj: Obj
    at: float  # perf_counter when the watch first delivered it
    gone: float | None = None  # when its deletion was delivered


class World:
    """The objects of ``KINDS`` as watches deliver them (all namespaces), with the moment
    each was first seen: what the stand-ins act on and the driver times."""

    KINDS = ("pods", "secrets", "configmaps", "services")

    def __init__(self, url: str):
        self.url = url
        self.http = httpx.Client(base_url=url, trust_env=False, timeout=30)
        self.changed = threading.Condition()
        self.seen: dict[tuple[str, str, str], Seen] = {}
        self._stop = threading.Event()
        self._clients: list[httpx.Client] = []
        self._threads = [threading.Thread(target=self._watch, args=(k,), daemon=True,
                                          name=f"watch-{k}") for k in self.KINDS]
        self._synced = {k: threading.Event() for k in self.KINDS}
        for t in self._threads:
            t.start()
        for k in self.KINDS:
            if not self._synced[k].wait(PATIENCE_S):
                raise RuntimeError(f"the watch of {k} did not start")

    def _watch(self, plural: str) -> None:
        rv = self.http.get(path_of(plural)).json()["metadata"]["resourceVersion"]
        self._synced[plural].set()
        client = httpx.Client(base_url=self.url, trust_env=False, timeout=None)
        self._clients.append(client)
        while not self._stop.is_set():
            try:
                with client.stream("GET", path_of(plural), params={
                        "watch": "true", "resourceVersion": rv,
                        "timeoutSeconds": "3600"}) as stream:
                    for line in stream.iter_lines():
                        if line:
                            rv = self._event(plural, json.loads(line)) or rv
            except (httpx.HTTPError, RuntimeError):
                if self._stop.wait(0.05):
                    return

    def _event(self, plural: str, event: Obj) -> str | None:
        now = time.perf_counter()
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        key = (plural, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self.changed:
            old = self.seen.get(key)
            if event.get("type") == "DELETED":
                if old is not None:
                    old.gone = now
            elif old is None or old.gone is not None:
                self.seen[key] = Seen(obj, now)
            else:
                old.obj = obj
            self.changed.notify_all()
        return str(meta.get("resourceVersion") or "") or None

    def get(self, plural: str, namespace: str, name: str) -> Seen | None:
        with self.changed:
            s = self.seen.get((plural, namespace, name))
            return None if s is None or s.gone is not None else s

    def wait(self, check: Callable[[], Any], what: str, timeout_s: float = PATIENCE_S) -> Any:
        """Until ``check()`` gives something true (returned), woken by each event."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not (got := check()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
                self.changed.wait(min(left, 0.5))
            return got

    def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        r = self.http.post(path_of("pods", meta["namespace"]), json=obj)
        r.raise_for_status()
        out: Obj = r.json()
        return out

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.http.delete(path_of(plural, namespace, name))

    def read(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        r = self.http.get(path_of(plural, namespace, name))
        return r.json() if r.status_code == 200 else None  # type: ignore[no-any-return]

    def patch_status(self, namespace: str, name: str, status: Obj) -> None:
        self.http.patch(path_of("pods", namespace, name) + "/status", json={"status": status},
                        headers={"Content-Type": "application/merge-patch+json"})

    def close(self) -> None:
        self._stop.set()
        for c in self._clients:
            c.close()
        self.http.close()


# -- gpupool's components -----------------------------------------------------------------------
def gpupool_argv() -> list[str]:
    """``gpupool`` as an image's entry point runs it: the console script of this install."""
    script = Path(sys.executable).parent / "gpupool"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpupool.cli.main"]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"),
                                                    env.get("PYTHONPATH", "")) if p)
    return env


class Proc:
    def __init__(self, argv: list[str], log: Path, env: Mapping[str, str] | None = None):
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.perf_counter()
        self.popen = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                      env=dict(env or child_env()), start_new_session=True)

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def check(self, what: str) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(f"{what} exited ({self.popen.returncode}):\n"
                               f"{self.output()[-3000:]}")

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (as kubelet stops a container), then SIGKILL to the process group."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            code = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = -9
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)
        return code


def get_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def poll(check: Callable[[], bool], what: str, procs: tuple[tuple[Proc, str], ...] = (),
         timeout_s: float = PATIENCE_S) -> float:
    """Poll ``check`` every ``POLL_S`` until it holds; the moment it did (perf_counter)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        for p, name in procs:
            p.check(name)
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(POLL_S)
    return time.perf_counter()


class Components:
    """``gpupool webhook``, ``extender`` and ``controller`` against ``url``, ready."""

    def __init__(self, url: str, root: Path, world: World, metrics_every_s: float = 10.0):
        self.root = root
        cmd = gpupool_argv()
        self.webhook_port, self.extender_port = free_port(), free_port()
        self.probe_port, self.metrics_port = free_port(), free_port()
        remote = ["--remote-provider", "stub"]
        self.webhook = Proc([*cmd, "webhook", "--server", url, "--namespace", SYSTEM_NS,
                             "--host", "127.0.0.1", "--port", str(self.webhook_port),
                             "--metrics-port", "0", *remote, "--slice-namespace", SLICES_NS,
                             "--slice-client-image", IMAGE, "--log-level", "WARNING"],
                            root / "webhook.log")
        self.extender = Proc([*cmd, "extender", "--server", url, "--namespace", SYSTEM_NS,
                              "--plain-http", "--host", "127.0.0.1",
                              "--port", str(self.extender_port),
                              "--probe-port", str(self.probe_port), "--remote-slices",
                              "--stale-after", "86400", "--log-level", "WARNING"],
                             root / "extender.log")
        self.controller = Proc([*cmd, "controller", "--server", url, "--namespace", SYSTEM_NS,
                                "--metrics-address", "127.0.0.1",
                                "--metrics-port", str(self.metrics_port), *remote,
                                "--slice-namespace", SLICES_NS, "--slice-server-image", IMAGE,
                                "--metrics-every", f"{metrics_every_s:g}",
                                "--stale-after", "86400", "--heal-silent-after", "86400",
                                "--log-level", "INFO"], root / "controller.log")
        procs = ((self.webhook, "gpupool webhook"), (self.extender, "gpupool extender"),
                 (self.controller, "gpupool controller"))
        poll(lambda: get_status(self.probe_port, "/readyz") == 200, "the extender", procs)
        poll(lambda: bool(self._bundle(world)), "the webhook's caBundle", procs)
        poll(lambda: _accepts(self.webhook_port), "the webhook's port", procs)
        poll(lambda: _leads(world), "the controller's lease", procs)
        self.ca = self._bundle(world)
        self.procs = procs

    @staticmethod
    def _bundle(world: World) -> str:
        conf = world.read("mutatingwebhookconfigurations", None, "gpupool-webhook") or {}
        hooks = conf.get("webhooks") or [{}]
        return base64.b64decode(hooks[0].get("clientConfig", {}).get("caBundle") or "").decode()

    def check(self) -> None:
        for p, name in self.procs:
            p.check(name)

    def close(self) -> None:
        for p, _ in self.procs:
            p.terminate(10)


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
        return True
    return False


def _leads(world: World) -> bool:
    lease = world.read("leases", SYSTEM_NS, "gpupool-controller") or {}
    return bool((lease.get("spec") or {}).get("holderIdentity"))


# -- kubelet ------------------------------------------------------------------------------------
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_PORT_FLAGS = ("--port=", "--status-port=", "--loopback-port=")


@dataclass
class Started:
    """A container kubelet started: its process and its pod's port map."""

    proc: Proc
    ports: dict[int, int]
    env: dict[str, str] = field(default_factory=dict)

    def port(self, number: int) -> int:
        return self.ports[number]


class Kubelet:
    """The one seam for the nodes: starts a pod's container as a process once its volumes'
    Secrets and ConfigMaps exist (module docstring: what is mapped, what is not)."""

    def __init__(self, world: World, root: Path):
        self.world = world
        self.root = root
        self.service_ports: dict[tuple[str, str], int] = {}  # Service -> a "cluster IP" port
        self.containers: list[Proc] = []  # every one started, stopped at the end
        self.pod_ports: dict[tuple[str, str], dict[int, int]] = {}

    def volumes_ready(self, pod_obj: Obj) -> bool:
        ns = pod_obj["metadata"]["namespace"]
        for v in pod_obj["spec"].get("volumes") or []:
            if "secret" in v and not v["secret"].get("optional") and self.world.get(
                    "secrets", ns, v["secret"]["secretName"]) is None:
                return False
            if "configMap" in v and self.world.get("configmaps", ns,
                                                   v["configMap"]["name"]) is None:
                return False
        return True

    def start(self, pod_obj: Obj, name: str, init: bool = False) -> Started:
        """Start container ``name`` of ``pod_obj`` (an init container when ``init``)."""
        meta, spec = pod_obj["metadata"], pod_obj["spec"]
        ns = meta["namespace"]
        c = next(c for c in spec.get("initContainers" if init else "containers") or []
                 if c["name"] == name)
        where = self.root / "pods" / ns / meta["name"]
        mounts = self._mount(pod_obj, c, where)
        env = {e["name"]: _env_value(e, pod_obj) for e in c.get("env") or []}
        ports = self.pod_ports.setdefault((ns, meta["name"]), {})
        args = [self._arg(_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a), mounts, ports)
                for a in c.get("args") or []]
        args += ["--host=127.0.0.1", "--status-address=127.0.0.1"] \
            if c["command"][-1] == "slice-server" else ["--status-address=127.0.0.1"]
        argv = [*gpupool_argv(), *c["command"][1:], *args]
        proc = Proc(argv, where / f"{name}.log", {**child_env(), **env})
        self.containers.append(proc)
        return Started(proc, ports, env)

    def stop_all(self) -> None:
        for proc in self.containers:
            if proc.popen.poll() is None:
                proc.terminate(5)

    def workload_address(self, pod_obj: Obj, container_name: str) -> tuple[str, int]:
        """``GPUPOOL_SLICE_ADDRESS`` of a container, mapped as its pod's ports are."""
        c = next(c for c in pod_obj["spec"]["containers"] if c["name"] == container_name)
        value = next(e["value"] for e in c.get("env") or []
                     if e["name"] == "GPUPOOL_SLICE_ADDRESS")
        host, port = value.rsplit(":", 1)
        meta = pod_obj["metadata"]
        ports = self.pod_ports.setdefault((meta["namespace"], meta["name"]), {})
        return host, ports.setdefault(int(port), free_port())

    def _mount(self, pod_obj: Obj, c: Obj, where: Path) -> dict[str, Path]:
        ns = pod_obj["metadata"]["namespace"]
        volumes = {v["name"]: v for v in pod_obj["spec"].get("volumes") or []}
        out = {}
        for m in c.get("volumeMounts") or []:
            v = volumes[m["name"]]
            d = where / "volumes" / m["name"]
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            if "secret" in v:
                seen = self.world.get("secrets", ns, v["secret"]["secretName"])
                data = {k: base64.b64decode(x).decode()
                        for k, x in ((seen.obj.get("data") or {}) if seen else {}).items()}
            else:
                seen = self.world.get("configmaps", ns, v["configMap"]["name"])
                data = dict((seen.obj.get("data") or {}) if seen else {})
            for k, text in data.items():
                (d / k).write_text(text)
            out[m["mountPath"]] = d
        return out

    def _arg(self, arg: str, mounts: Mapping[str, Path], ports: dict[int, int]) -> str:
        flag, eq, value = arg.partition("=")
        if not eq:
            return arg
        for inside, outside in mounts.items():
            if value == inside or value.startswith(inside + "/"):
                return f"{flag}={outside}{value[len(inside):]}"
        if flag + "=" in _PORT_FLAGS:
            return f"{flag}={ports.setdefault(int(value), free_port())}"
        if flag == "--slice-server":  # cluster DNS: the Service's name -> its "cluster IP"
            host, port = value.rsplit(":", 1)
            svc, svc_ns = host.split(".")[:2]
            return f"{flag}=127.0.0.1:{self.service_port(svc_ns, svc, int(port))}"
        return arg

    def service_port(self, namespace: str, name: str, port: int) -> int:
        """Where Service ``name``'s ``port`` answers: the port its selected pod's
        ``targetPort`` is mapped to (one map per Service: the pods it selects in turn)."""
        return self.service_ports.setdefault((namespace, name), free_port())

    def bind_service_ports(self, server_pod: Obj) -> None:
        """Map the ports of ``server_pod`` that a Service selecting it targets to the
        Service's own, before the pod's container starts."""
        meta = server_pod["metadata"]
        labels = meta.get("labels") or {}
        ports = self.pod_ports.setdefault((meta["namespace"], meta["name"]), {})
        with self.world.changed:
            services = [s.obj for (kind, ns, _), s in self.world.seen.items()
                        if kind == "services" and ns == meta["namespace"] and s.gone is None]
        for svc in services:
            selector = (svc.get("spec") or {}).get("selector") or {}
            if selector and all(labels.get(k) == v for k, v in selector.items()):
                for p in svc["spec"].get("ports") or []:
                    ports[int(p["targetPort"])] = self.service_port(
                        meta["namespace"], svc["metadata"]["name"], int(p["port"]))


def _env_value(e: Obj, pod_obj: Obj) -> str:
    if "value" in e:
        return str(e["value"])
    path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
    if path == "metadata.uid":
        return str(pod_obj["metadata"]["uid"])
    raise ValueError(f"kubelet stand-in: no value for {e}")


# -- the driver: API server's admission, kube-scheduler, the workload -------------------------
@dataclass
class Run:
    """One client pod's way to a usable slice: perf_counter moments, and what it made."""

    begun: float = 0.0
    created: float = 0.0  # admission done, the pod stored
    bound: float = 0.0  # the extender's bind answered
    server_started: float = 0.0  # kubelet started the server (its pod and volumes were there)
    sidecar_started: float = 0.0
    listening: float = 0.0  # the server's /healthz answered 200
    ready: float = 0.0  # the sidecar's /ready answered 200
    usable: float = 0.0  # the workload's first alloc/write/read/checksum answered
    pod: Obj = field(default_factory=dict)  # the client pod as bound (its decision)
    server_pod: Obj = field(default_factory=dict)
    server: Started | None = None
    sidecar: Started | None = None

    def stages(self) -> dict[str, float]:
        return {"admission": self.created - self.begun,
                "scheduling + bind": self.bound - self.created,
                "controller reaction": self.server_started - self.bound,
                "server start to listening": self.listening - self.server_started,
                "sidecar handshake": self.ready - self.listening,
                "first call": self.usable - self.ready,
                "total": self.usable - self.begun}


class Driver:
    def __init__(self, world: World, components: Components, kubelet: Kubelet):
        self.world = world
        self.components = components
        self.kubelet = kubelet
        self._webhook: http.client.HTTPConnection | None = None
        self._extender = httpx.Client(
            base_url=f"http://127.0.0.1:{components.extender_port}", trust_env=False,
            timeout=30)

    # the API server's admission step
    def _review(self, path: str, obj: Obj) -> Obj:
        if self._webhook is None:
            ctx = ssl.create_default_context(cadata=self.components.ca)
            raw = socket.create_connection(("127.0.0.1", self.components.webhook_port), 10)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._webhook = http.client.HTTPConnection(WEBHOOK_HOST, timeout=10)
            self._webhook.sock = ctx.wrap_socket(raw, server_hostname=WEBHOOK_HOST)
        self._webhook.request("POST", path, body(review(obj)),
                              {"Content-Type": "application/json"})
        answer = json.loads(self._webhook.getresponse().read())["response"]
        if not answer["allowed"]:
            raise RuntimeError(f"{path} refused the pod: {answer['status']['message']}")
        return answer  # type: ignore[no-any-return]

    def admit(self, obj: Obj) -> Obj:
        """Mutate, apply the patch, validate, store (the API server's part, played here)."""
        answer = self._review("/mutate", obj)
        ops = json.loads(base64.b64decode(answer.get("patch") or "W10="))
        mutated = applied(obj, Verdict.allow(ops))
        self._review("/validate", mutated)
        mutated["status"] = {"phase": "Pending"}  # what the API server defaults
        return self.world.create(mutated)

    # kube-scheduler
    def schedule(self, created: Obj) -> str:
        meta = created["metadata"]
        seen = self.world.wait(lambda: self.world.get("pods", meta["namespace"], meta["name"]),
                               "the scheduler's watch to see the pod")
        obj = seen.obj
        wanted = obj["spec"].get("nodeSelector") or {}
        nodes = [n["metadata"]["name"] for n in self._nodes()
                 if all((n["metadata"].get("labels") or {}).get(k) == v
                        for k, v in wanted.items())]
        passed = self._verb("filter", {"Pod": obj, "Nodes": None, "NodeNames": nodes})
        if passed.get("Error") or not passed.get("NodeNames"):
            raise RuntimeError(f"filter passed no node: {passed}")
        best = passed["NodeNames"][0]
        if len(passed["NodeNames"]) > 1:
            scores = {h["Host"]: h["Score"] for h in self._verb(
                "prioritize", {"Pod": obj, "Nodes": None, "NodeNames": passed["NodeNames"]})}
            best = max(passed["NodeNames"], key=lambda n: scores.get(n, 0))
        bound = self._verb("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                    "PodUID": meta["uid"], "Node": best})
        if bound.get("Error"):
            raise RuntimeError(f"bind refused: {bound['Error']}")
        return str(best)

    _node_list: list[Obj] | None = None

    def _nodes(self) -> list[Obj]:
        if self._node_list is None:  # kube-scheduler's node informer: listed once
            self._node_list = self.world.http.get(path_of("nodes")).json()["items"]
        return self._node_list

    def _verb(self, verb: str, args: Obj) -> Any:
        r = self._extender.post(f"/{verb}", json=args)
        r.raise_for_status()
        return r.json()

    # the whole way, timed
    def run(self, name: str) -> Run:
        run = Run()
        run.begun = time.perf_counter()
        created = self.admit(client_pod(name))
        run.created = time.perf_counter()
        self.schedule(created)
        run.bound = time.perf_counter()
        meta = created["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        slice_name = meta["annotations"][names.ANNOTATION_SLICE]
        client_secret = slices.client_secret(slice_name)

        def server_startable() -> Obj | None:
            for (kind, pns, _), s in self.world.seen.items():
                labels = s.obj["metadata"].get("labels") or {}
                if kind == "pods" and pns == SLICES_NS and s.gone is None and \
                        labels.get(slices.LABEL_POD_UID) == uid and \
                        self.kubelet.volumes_ready(s.obj):
                    return s.obj
            return None

        def sidecar_startable() -> Obj | None:
            s = self.world.get("pods", ns, meta["name"])
            if s is None or not s.obj["spec"].get("nodeName") or \
                    self.world.get("secrets", ns, client_secret) is None:
                return None
            return s.obj

        while run.server is None or run.sidecar is None:  # kubelet, on each event
            with self.world.changed:
                server, client = self.world.wait(
                    lambda: ((run.server is None and server_startable()) or
                             (run.sidecar is None and sidecar_startable())) and
                    (server_startable() if run.server is None else None,
                     sidecar_startable() if run.sidecar is None else None),
                    "the server pod and the sidecar's Secret")
            if server is not None:
                self.kubelet.bind_service_ports(server)
                run.server_pod = server
                run.server = self.kubelet.start(server, "server")
                run.server_started = run.server.proc.started
            if client is not None:
                run.pod = client
                run.sidecar = self.kubelet.start(client, slices.SIDECAR, init=True)
                run.sidecar_started = run.sidecar.proc.started
        server, sidecar = run.server, run.sidecar
        both = ((server.proc, "the slice server"), (sidecar.proc, "the sidecar"),
                *self.components.procs)
        run.listening = poll(lambda: get_status(server.port(slices.SERVER_STATUS_PORT),
                                                "/healthz") == 200, "the server", both)
        run.ready = poll(lambda: get_status(sidecar.port(slices.CLIENT_STATUS_PORT),
                                            "/ready") == 200, "the sidecar", both)
        host, port = self.kubelet.workload_address(run.pod, "main")
        with StubClient(host, port, timeout_s=PATIENCE_S) as workload:
            h = workload.alloc(4096)
            workload.write(h, b"\x5a" * 4096)
            if workload.read(h, 4096) != b"\x5a" * 4096:
                raise RuntimeError("the slice gave back other bytes than were written")
            workload.checksum(h)
        run.usable = time.perf_counter()
        return run

    def report_ready(self, run: Run) -> None:
        """Kubelet's readiness report of the server pod (its probe passed)."""
        meta = run.server_pod["metadata"]
        self.world.patch_status(meta["namespace"], meta["name"], {
            "phase": "Running", "conditions": [{
                "type": "Ready", "status": "True",
                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]})

    def release(self, run: Run) -> float:
        """Delete the client pod (kubelet stops its sidecar); once the controller deleted
        the server pod, kubelet stops the server (SIGTERM). Seconds from the deletion to the
        server pod's."""
        meta = run.pod["metadata"]
        asked = time.perf_counter()
        self.world.delete("pods", meta["namespace"], meta["name"])
        if run.sidecar is not None:
            run.sidecar.proc.terminate(10)
        smeta = run.server_pod["metadata"]
        self.world.wait(lambda: self.world.get("pods", SLICES_NS, smeta["name"]) is None,
                        "the controller to delete the server pod")
        with self.world.changed:
            gone = self.world.seen[("pods", SLICES_NS, smeta["name"])].gone or asked
        if run.server is not None:
            run.server.proc.terminate(30)
        return gone - asked

    def close(self) -> None:
        if self._webhook is not None:
            self._webhook.close()
        self._extender.close()


@contextlib.contextmanager
def control_path(url: str, root: Path, metrics_every_s: float = 10.0) -> Iterator[Driver]:
    """The components running against ``url`` (seeded with ``seed_objects``), and a driver;
    ``metrics_every_s``: the controller's ``--metrics-every`` (its own default, 10 s)."""
    world = World(url)
    components = None
    try:
        components = Components(url, root, world, metrics_every_s)
        kubelet = Kubelet(world, root)
        driver = Driver(world, components, kubelet)
        try:
            yield driver
        finally:
            driver.close()
            kubelet.stop_all()
    finally:
        if components is not None:
            components.close()
        world.close()
