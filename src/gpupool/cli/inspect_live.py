"""The live views of ``gpupool inspect`` and ``kubectl gpupool``: nodes, pod, groups.

Both commands take the same options and views (``inspect_views``) and run the same
functions, here: connect with the kubeconfig found as
kubectl finds it (``gpupool.kube.kubeconfig``), list nodes, GPUDevices, pods,
ResourceClasses and ResourceGroups once, read gpupool's published decision keys,
build the cluster as gpupool counts it (``inspect_cluster``) and print one report
(``inspect_report``, ``inspect_render``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpupool.cli.args import check_policies
from gpupool.cli.inspect_cluster import LiveCluster, Signatures, build
from gpupool.cli.inspect_render import emit
from gpupool.cli.inspect_report import groups_report, nodes_report, pod_report
from gpupool.core.errors import InvalidInput
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.kube import kubeconfig
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import KubeError, NotFound
from gpupool.kube.keystore import PUBLIC_CONFIG_MAP
from gpupool.security.signing import KeyMaterialError, KeyRing

# -- running a view ---------------------------------------------------------------------------


def connect(args: argparse.Namespace) -> tuple[KubeApi, kubeconfig.Loaded]:
    offline = [flag for flag in ("nodes", "pod", "running")
               if getattr(args, flag, None) is not None]
    if offline:
        raise InvalidInput(f"--{offline[0]} FILE is for explaining offline; a live view "
                           "reads the cluster (leave out the view's name, or the files)")
    loaded = kubeconfig.load(args.kubeconfig, args.context)
    try:
        api = KubeApi(loaded.config, timeout_s=args.request_timeout)
    except (OSError, ValueError) as exc:  # TLS files lightkube could not load
        raise kubeconfig.KubeconfigError(
            f"{loaded.source}: context {loaded.context}: cannot set up a connection to "
            f"{loaded.server} ({type(exc).__name__}: {exc})") from None
    try:
        kubeconfig.reach(loaded)
    except kubeconfig.KubeconfigError:
        api.close()
        raise
    return api, loaded


@contextmanager
def _naming_the_server(loaded: kubeconfig.Loaded) -> Iterator[None]:
    """A call nothing answered says which server was tried, and from which configuration."""
    where = f"{loaded.server} (context {loaded.context} of {loaded.source})"
    try:
        yield
    except KubeError as exc:
        if exc.code:
            raise
        raise KubeError(f"cannot reach the Kubernetes API at {where}: {exc}") from None
    except (OSError, ValueError) as exc:  # e.g. the credential plugin the context runs
        raise KubeError(f"calling the Kubernetes API at {where} failed: "
                        f"{type(exc).__name__}: {exc}") from None


def gather(api: KubeApi, args: argparse.Namespace) -> LiveCluster:
    """List what the views read and build the cluster as gpupool counts it."""
    problems: list[str] = []
    try:
        devices = api.list_gpu_devices().items
    except NotFound as exc:
        raise KubeError(f"gpupool's custom resources are not installed in this cluster "
                        f"({exc})", exc.code) from None
    classes = _optional(api.list_resource_classes, "ResourceClass", problems)
    groups = _optional(api.list_resource_groups, "ResourceGroup", problems)
    live = build(api.list_nodes().items, devices, api.list_pods().items, classes, groups,
                 read_signatures(api, args.gpupool_namespace), time.time(), args.stale_after,
                 args.memory_unit, _ledgers(api, problems))
    live.problems[:0] = problems
    return live


def _ledgers(api: KubeApi, problems: list[str]) -> list[Any]:
    """The GPU ledgers (they vouch for decisions bound before signing existed)."""
    try:
        return list(api.list_ledgers().items)
    except KubeError as exc:
        if not exc.code:
            raise
        problems.append(f"GPU ledgers cannot be read ({exc}): an unsigned decision the "
                        "extender vouches for by its ledger entry shows as forged")
        return []


def _optional(lister: Callable[[], Any], kind: str, problems: list[str]) -> list[Any]:
    try:
        return list(lister().items)
    except NotFound:
        problems.append(f"the {kind} custom resource is not installed (none shown)")
        return []


def read_signatures(api: KubeApi, namespace: str) -> Signatures:
    """The published decision keys, or why they cannot be had."""
    where = f"ConfigMap {namespace}/{PUBLIC_CONFIG_MAP}"
    try:
        data, _ = api.get_config_map_data(namespace, PUBLIC_CONFIG_MAP)
    except NotFound:
        return Signatures(None, f"{where} does not exist (gpupool publishes no decision "
                                "keys in this cluster; see --gpupool-namespace)")
    except KubeError as exc:
        return Signatures(None, f"{where} cannot be read ({exc})")
    try:
        return Signatures(KeyRing.from_data(data, where))
    except KeyMaterialError as exc:
        return Signatures(None, str(exc))


def _run(args: argparse.Namespace, report: Callable[[LiveCluster], dict[str, Any]]) -> int:
    api, loaded = connect(args)
    try:
        with _naming_the_server(loaded):
            live = gather(api, args)
        emit(report(live), args.output)
    finally:
        api.close()
    return 0


def run_nodes(args: argparse.Namespace) -> int:
    return _run(args, lambda live: nodes_report(live, args.names))


def run_groups(args: argparse.Namespace) -> int:
    return _run(args, groups_report)


def pod_ref(ref: str, namespace: str | None, default: str) -> tuple[str, str]:
    """(namespace, name) of ``NS/NAME`` or ``NAME`` (then ``namespace`` or ``default``)."""
    ns, slash, name = ref.rpartition("/")
    if not slash:
        return namespace or default, ref
    if not ns or not name or "/" in ns:
        raise InvalidInput(f"pod {ref!r}: expected NAMESPACE/NAME or NAME")
    if namespace and namespace != ns:
        raise InvalidInput(f"pod {ref!r} is in namespace {ns}, but --namespace says {namespace}")
    return ns, name


def run_pod(args: argparse.Namespace) -> int:
    policy, seed = getattr(args, "policy", DEFAULT_POLICY), getattr(args, "seed", 0)
    check_policies([policy])
    api, loaded = connect(args)
    try:
        ns, name = pod_ref(args.ref, args.namespace, loaded.namespace)
        with _naming_the_server(loaded):
            try:
                pod = api.get_pod(ns, name)
            except NotFound:
                print(f"pod {name} not found in namespace {ns} (context {loaded.context})",
                      file=sys.stderr)
                return 1
            live = gather(api, args)
        emit(pod_report(live, pod, policy, seed), args.output)
    finally:
        api.close()
    return 0
