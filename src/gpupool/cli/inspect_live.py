"""The live views of ``gpupool inspect`` and ``kubectl gpupool``: nodes, pod, groups.

Both commands take the same options and views from here (``add_options``,
``add_views``) and run the same functions: connect with the kubeconfig found as
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

from gpupool.cli.args import bounded
from gpupool.cli.inspect_cluster import LiveCluster, Signatures, build
from gpupool.cli.inspect_render import OUTPUTS, emit
from gpupool.cli.inspect_report import groups_report, nodes_report, pod_report
from gpupool.core.errors import InvalidInput
from gpupool.core.policies import DEFAULT_POLICY, POLICIES
from gpupool.kube import kubeconfig
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import KubeError, NotFound
from gpupool.kube.keystore import PUBLIC_CONFIG_MAP
from gpupool.security.signing import KeyMaterialError, KeyRing

GPUPOOL_NAMESPACE = "gpupool-system"

VIEWS_HELP = """views:
  nodes [NODE ...]   every GPU node: per GPU its model, health, isolation, memory and
                     compute allocated of total and the pods holding slices; per node
                     its fragmentation
  pod [NS/]NAME      one pod: its phase, gpupool's decision and whether its signature
                     holds, and for a pending pod why each node does or does not fit
  groups             resource groups with their quota used and limit, and what each
                     namespace holds"""

CONNECTION_HELP = """The cluster is found as kubectl finds it: --kubeconfig FILE, else the files
listed in KUBECONFIG (merged as kubectl merges them), else ~/.kube/config, else the
service account of the pod it runs in."""


def add_options(parser: Any, *, copy: bool = False) -> None:
    """The options every live view takes (on a parser or an argument group). ``copy``: on
    a view's own parser, where an option left out must not replace the one given before
    the view's name."""
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if copy else value

    parser.add_argument("--kubeconfig", metavar="FILE", default=default(None),
                        help="kubeconfig file (default: as kubectl finds it)")
    parser.add_argument("--context", metavar="NAME", default=default(None),
                        help="kubeconfig context (default: its current context)")
    parser.add_argument("-o", "--output", choices=OUTPUTS, default=default("table"),
                        help="output format (default table)")
    parser.add_argument("--gpupool-namespace", metavar="NS", default=default(GPUPOOL_NAMESPACE),
                        help="namespace gpupool runs in, where its decision keys are "
                             f"published (default {GPUPOOL_NAMESPACE})")
    parser.add_argument("--stale-after", type=bounded(float, 0, above=True), metavar="SECONDS",
                        default=default(120.0),
                        help="a GPU whose heartbeat is older takes no new slices, as with "
                             "the extender's flag of the same name (default 120)")
    parser.add_argument("--memory-unit", type=bounded(int, 1), metavar="MIB",
                        default=default(256),
                        help="GPU memory accounting unit, as with the extender's flag of the "
                             "same name (default 256)")
    parser.add_argument("--request-timeout", type=bounded(float, 0, above=True),
                        metavar="SECONDS", default=default(30.0),
                        help="how long to wait for each API call (default 30)")


def add_views(subparsers: Any, *, copies: bool) -> list[argparse.ArgumentParser]:
    """The ``nodes``, ``pod`` and ``groups`` views (each also takes the options, so that
    they may come after the view's name); ``copies``: the options are also on the parent
    parser. The pod view's --policy and --seed are left unset when not given (the parent
    may hold them); ``run_pod`` falls back to the defaults."""
    def view(name: str, run: Callable[[argparse.Namespace], int], text: str
             ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = subparsers.add_parser(
            name, help=text, description=text + "\n\n" + CONNECTION_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_options(p, copy=copies)
        p.set_defaults(func=run)
        return p

    nodes = view("nodes", run_nodes, "GPU nodes: GPUs, health, isolation, allocation, "
                 "holders, fragmentation")
    nodes.add_argument("names", nargs="*", metavar="NODE", help="only these nodes")
    pod = view("pod", run_pod, "one pod: gpupool's decision, its signature, why it does or "
               "does not fit")
    pod.add_argument("ref", metavar="[NAMESPACE/]NAME", help="the pod")
    pod.add_argument("-n", "--namespace", metavar="NS",
                     help="the pod's namespace (default: the context's namespace)")
    pod.add_argument("--policy", default=argparse.SUPPRESS, metavar="NAME",
                     help=f"placement policy that scores the nodes a pending pod fits "
                          f"(default {DEFAULT_POLICY}, as the extender's; known: "
                     f"{', '.join(sorted(POLICIES))})")
    pod.add_argument("--seed", type=int, default=argparse.SUPPRESS, metavar="N",
                     help="seed for ties (default 0)")
    groups = view("groups", run_groups, "resource groups and quotas (used / limit), usage per "
                  "namespace")
    return [nodes, pod, groups]


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
    if policy not in POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}; known policies: "
                           f"{', '.join(sorted(POLICIES))}")
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
