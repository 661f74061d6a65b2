"""Find and read the Kubernetes configuration the way kubectl does, or say in one line why not.

Where the configuration comes from, first match wins (kubectl's loading rules):

1. an explicit file (``--kubeconfig``): it must exist;
2. else the files listed in ``KUBECONFIG`` (separated by ``:``, ``;`` on Windows),
   merged: files that do not exist are skipped, the first file to define a cluster,
   context or user of a given name wins (later definitions of that name are ignored
   whole), the first file that sets ``current-context`` sets it, and a relative file
   path inside a file (certificate authority, client certificate and key, token file,
   an exec command with a ``/`` in it) is taken relative to that file's folder;
3. else ``~/.kube/config`` when it exists;
4. else, inside a pod, the pod's service account.

A context named with ``--context`` replaces ``current-context``. What is not taken
from kubectl: its ``preferences`` and ``extensions`` (ignored), the migration of a
pre-1.0 ``~/.kube/.kubeconfig``, and its fall-back to ``http://localhost:8080`` when
nothing is configured (an error here instead).

Everything that makes a file not a usable kubeconfig — missing, unreadable, broken
YAML, not a map, no current context, a context naming a cluster or user that is not
there, a field of the wrong type — raises ``KubeconfigError`` naming the file and
what is wrong, in one line.
"""

from __future__ import annotations

import base64
import binascii
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import yaml
from lightkube.config.kubeconfig import SERVICE_ACCOUNT, KubeConfig
from lightkube.config.models import Cluster, Context, User
from lightkube.core.exceptions import ConfigError

from gpupool.kube.connection import proxy_for
from gpupool.kube.errors import KubeconfigError as KubeconfigError  # raised from here too

DEFAULT_FILE = "~/.kube/config"
DEFAULT_NAMESPACE = "default"
MAX_BYTES = 16 * 1024 * 1024
ANONYMOUS = "gpupool:no-credentials"  # the user of a context that names none
SECTIONS = (("clusters", "cluster", Cluster), ("contexts", "context", Context),
            ("users", "user", User))
_PATHS = {"cluster": ("certificate-authority",),
          "user": ("client-certificate", "client-key", "tokenFile")}


@dataclass(frozen=True, slots=True)
class Loaded:
    """A usable configuration, where it came from, and its context's namespace."""

    config: KubeConfig
    source: str
    context: str
    namespace: str

    @property
    def server(self) -> str:
        single = self.config.get()
        return single.cluster.server if single is not None else "?"


def load(explicit: str | None = None, context: str | None = None,
         env: Mapping[str, str] | None = None, home: Path | None = None,
         service_account: str | Path = SERVICE_ACCOUNT) -> Loaded:
    """The configuration by kubectl's rules (module docstring); ``KubeconfigError`` if
    there is none or it cannot be used."""
    env = os.environ if env is None else env
    files = candidates(explicit, env, home)
    if explicit and not Path(explicit).expanduser().exists():
        raise KubeconfigError(f"kubeconfig {explicit}: no such file (check the path; without "
                              "--kubeconfig, KUBECONFIG and then ~/.kube/config are read, as "
                              "kubectl does)")
    docs = [(path, read_file(path)) for path in files if Path(path).expanduser().exists()]
    if not docs:
        return _in_cluster(files, env, Path(service_account))
    return _select(docs, context)


def candidates(explicit: str | None, env: Mapping[str, str], home: Path | None) -> list[str]:
    """The files to read, in order of precedence (duplicates dropped)."""
    if explicit:
        return [explicit]
    listed = env.get("KUBECONFIG", "")
    if listed:
        return list(dict.fromkeys(p for p in listed.split(os.pathsep) if p))
    base = home if home is not None else Path("~").expanduser()
    return [str(base / ".kube" / "config")]


def read_file(path: str) -> Mapping[str, Any]:
    """One kubeconfig file as a map (an empty file is an empty configuration)."""
    where = f"kubeconfig {path}"
    file = Path(path).expanduser()
    try:
        if not file.is_file():
            raise KubeconfigError(f"{where}: not a file")
        text = file.read_bytes()[:MAX_BYTES + 1].decode("utf-8")
    except OSError as exc:
        raise KubeconfigError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise KubeconfigError(f"{where}: not UTF-8 text; not a kubeconfig") from None
    if len(text) > MAX_BYTES:
        raise KubeconfigError(f"{where}: larger than {MAX_BYTES} bytes; not a kubeconfig")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"{where}: not valid YAML ({_yaml_problem(exc)})") from None
    return _checked(where, doc)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    if mark is None:
        return str(problem)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _checked(where: str, doc: Any) -> Mapping[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise KubeconfigError(f"{where}: not a kubeconfig (expected a map with clusters, "
                              f"contexts and users, got {_noun(doc)})")
    kind = doc.get("kind", "Config")
    if kind != "Config":
        raise KubeconfigError(f"{where}: kind is {kind!r}, not 'Config'; not a kubeconfig")
    if not any(k in doc for k in ("clusters", "contexts", "users", "current-context")):
        raise KubeconfigError(f"{where}: not a kubeconfig (no clusters, contexts or users)")
    for section, _, _ in SECTIONS:
        entries = doc.get(section) or []
        if not isinstance(entries, list):
            raise KubeconfigError(f"{where}: {section} must be a list, got {_noun(entries)}")
        for k, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) \
                    or not entry.get("name"):
                raise KubeconfigError(f"{where}: {section} entry {k + 1} has no name")
    current = doc.get("current-context")
    if current is not None and not isinstance(current, str):
        raise KubeconfigError(f"{where}: current-context must be a name, got {_noun(current)}")
    return doc


def _noun(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "true/false", dict: "a map"}.get(type(value), type(value).__name__)


@dataclass(frozen=True, slots=True)
class _Entry:
    value: Any
    origin: str


def merge(docs: Sequence[tuple[str, Mapping[str, Any]]]
          ) -> tuple[dict[str, dict[str, _Entry]], str | None, str | None]:
    """(entries by section and name, current-context, the file that set it): the first
    definition of a name wins, relative paths resolved against their own file."""
    merged: dict[str, dict[str, _Entry]] = {section: {} for section, _, _ in SECTIONS}
    current: str | None = None
    current_origin: str | None = None
    for path, doc in docs:
        for section, inner, model in SECTIONS:
            for entry in doc.get(section) or []:
                name = entry["name"]
                if name not in merged[section]:
                    value = _converted(path, section, name, entry.get(inner), model)
                    merged[section][name] = _Entry(value, path)
        if not current and doc.get("current-context"):
            current, current_origin = doc["current-context"], path
    return merged, current, current_origin


def _converted(path: str, section: str, name: str, body: Any, model: type) -> Any:
    where = f"kubeconfig {path}: {section[:-1]} {name!r}"
    if not isinstance(body, Mapping):
        raise KubeconfigError(f"{where} has no {section[:-1]} map")
    if section == "clusters" and (not isinstance(body.get("server"), str) or
                                  not body.get("server")):
        raise KubeconfigError(f"{where} has no server")
    body = _resolved(dict(body), section[:-1], Path(path).expanduser().absolute().parent)
    try:
        return msgspec.convert(body, model)
    except msgspec.ValidationError as exc:
        raise KubeconfigError(f"{where}: {str(exc).replace('`', '')}") from None


def _resolved(body: dict[str, Any], kind: str, base: Path) -> dict[str, Any]:
    """File paths in ``body`` made absolute against the kubeconfig's folder."""
    for key in _PATHS.get(kind, ()):
        value = body.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            body[key] = str(base / value)
    run = body.get("exec")
    if kind == "user" and isinstance(run, Mapping):
        command = run.get("command")
        if isinstance(command, str) and "/" in command and not Path(command).is_absolute():
            body["exec"] = {**run, "command": str(base / command)}
    return body


def _select(docs: Sequence[tuple[str, Mapping[str, Any]]], context: str | None) -> Loaded:
    merged, current, origin = merge(docs)
    files = ", ".join(p for p, _ in docs)
    where = f"kubeconfig {files}"
    name = context or current
    if not name:
        raise KubeconfigError(f"{where}: no current context is set (pick one with "
                              "--context NAME or kubectl config use-context NAME)")
    ctx = merged["contexts"].get(name)
    if ctx is None:
        known = ", ".join(sorted(merged["contexts"])) or "none"
        said = "--context" if context else f"current-context in {origin}"
        raise KubeconfigError(f"{where}: context {name!r} ({said}) does not exist "
                              f"(known: {known})")
    _check_refs(ctx, name, merged)
    contexts = {k: e.value for k, e in merged["contexts"].items()}
    users = {k: e.value for k, e in merged["users"].items()}
    if not ctx.value.user:  # kubectl then sends no credentials; lightkube wants a user
        users[ANONYMOUS] = User()
        contexts[name] = Context(cluster=ctx.value.cluster, user=ANONYMOUS,
                                 namespace=ctx.value.namespace)
    config = KubeConfig(clusters={k: e.value for k, e in merged["clusters"].items()},
                        contexts=contexts, users=users, current_context=name,
                        fname=docs[0][0])
    try:
        config.get()
    except (ConfigError, KeyError) as exc:
        raise KubeconfigError(f"{where}: context {name!r} cannot be used ({exc})") from None
    source = f"kubeconfig {ctx.origin}" if len(docs) == 1 else f"KUBECONFIG {files}"
    return Loaded(config, source, name, ctx.value.namespace or DEFAULT_NAMESPACE)


def _check_refs(ctx: _Entry, name: str, merged: Mapping[str, Mapping[str, _Entry]]) -> None:
    where = f"kubeconfig {ctx.origin}: context {name!r}"
    cluster = merged["clusters"].get(ctx.value.cluster)
    if cluster is None:
        raise KubeconfigError(f"{where} names cluster {ctx.value.cluster!r}, which is not "
                              "defined")
    if ctx.value.user and ctx.value.user not in merged["users"]:
        raise KubeconfigError(f"{where} names user {ctx.value.user!r}, which is not defined")
    server = cluster.value.server
    if not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"kubeconfig {cluster.origin}: cluster {ctx.value.cluster!r}: "
                              f"server {server!r} is not an http:// or https:// URL")
    user = merged["users"].get(ctx.value.user or "")
    _check_file(cluster, "certificate-authority", cluster.value.certificate_auth)
    _check_data(cluster, f"cluster {ctx.value.cluster!r}", "certificate-authority-data",
                cluster.value.certificate_auth_data)
    if user is not None:
        for key, path in (("client-certificate", user.value.client_cert),
                          ("client-key", user.value.client_key),
                          ("tokenFile", user.value.token_file)):
            _check_file(user, key, path)
        for key, data in (("client-certificate-data", user.value.client_cert_data),
                          ("client-key-data", user.value.client_key_data)):
            _check_data(user, f"user {ctx.value.user!r}", key, data)


def _check_data(entry: _Entry, what: str, key: str, data: str | None) -> None:
    """Inline certificates and keys are base64 (else lightkube fails obscurely)."""
    if data is None:
        return
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise KubeconfigError(f"kubeconfig {entry.origin}: {what}: {key} is not "
                              "base64") from None


def _check_file(entry: _Entry, key: str, path: str | None) -> None:
    """A file a cluster or user names must be there (else lightkube fails obscurely)."""
    if path is not None and not Path(path).expanduser().is_file():
        raise KubeconfigError(f"kubeconfig {entry.origin}: {key} {path} does not exist")


def _in_cluster(files: Sequence[str], env: Mapping[str, str], account: Path) -> Loaded:
    if not (account / "token").is_file() or not env.get("KUBERNETES_SERVICE_HOST"):
        tried = (f"none of the files KUBECONFIG lists exists ({', '.join(files)})"
                 if env.get("KUBECONFIG") else
                 f"KUBECONFIG is not set and {files[0] if files else DEFAULT_FILE} does not exist")
        raise KubeconfigError(f"no Kubernetes configuration: {tried}, and this is not a pod "
                              "with a service account (give --kubeconfig FILE)")
    try:
        config = KubeConfig.from_service_account(account)
        single = config.get()
    except (ConfigError, OSError, KeyError) as exc:
        raise KubeconfigError(f"the pod's service account in {account} cannot be used "
                              f"({exc})") from None
    assert single is not None
    return Loaded(config, f"service account in {account}", single.context_name,
                  single.namespace)


REACH_TIMEOUT_S = 3.0
"""How long ``reach`` waits for the server to accept a connection."""


def reach(loaded: Loaded, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise ``KubeconfigError`` when nothing accepts a connection at the configuration's
    server (refused, no such host, timed out): said once at start-up, in one line, instead
    of every later call failing. Only the connection is tried, not TLS or credentials;
    a server reached through a proxy (``HTTPS_PROXY``) is not tried."""
    server = loaded.server
    host, port = _host_port(server)
    if host is None or proxy_for(server) is not None:
        return
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (
            exc.strerror or str(exc) or type(exc).__name__).lower()
        raise KubeconfigError(
            f"{loaded.source}: server {server} (context {loaded.context}) cannot be reached: "
            f"{why} (is the cluster running and is this its address? `kubectl cluster-info` "
            "tries the same)") from None


def _host_port(server: str) -> tuple[str | None, int]:
    try:
        url = urlsplit(server)
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return None, 0
    return url.hostname, port
