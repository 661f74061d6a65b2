"""``gpupool inspect``: where pods are and would go, and why — live or from files.

Live (``inspect_live``): the views ``nodes``, ``pod`` and ``groups`` read a cluster
through its kubeconfig, as ``kubectl gpupool`` does. Offline (this module): a
cluster file (``--nodes``: gpupool YAML or an Alibaba node-list CSV, as ``gpupool
simulate`` reads them, classes included) and a Pod manifest (``--pod``), translated
with the resource names the scheduler extender reads; ``--running`` places a
workload first. For every node it prints whether the pod fits — with the policy's
score and the GPUs it would take — or the reason it does not, a sentence from the
core's fit checks.

Exit code: 0 when some node fits (offline) or the view was printed (live); 1 when
no node fits (offline) or the pod does not exist (live); 2 on bad input, a
kubeconfig that cannot be used, or a failed API call.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml
from rich.table import Table

from gpupool.cli.args import bounded, check_policies
from gpupool.cli.inspect_fit import NodeVerdict, nodes_json, ordered, slices_text, verdicts
from gpupool.cli.inspect_views import CONNECTION_HELP, VIEWS_HELP, add_options, add_views
from gpupool.cli.tables import screen, show
from gpupool.contract.podshape import POD
from gpupool.contract.podspec_request import pod_request
from gpupool.contract.yamlcheck import load_text
from gpupool.core.classes import ClassCatalog
from gpupool.core.eligibility import Catalogue, constraints_for
from gpupool.core.errors import InvalidInput
from gpupool.core.placement import Placer
from gpupool.core.policies import DEFAULT_POLICY, POLICIES, make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.reasons import Reason
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload
from gpupool.sim.sources import read_cluster, read_pods

MAX_POD_BYTES = 1024 * 1024
DEFAULT_LIMIT = 20
"""Nodes the offline table lists unless told (the rest are counted, by reason)."""


DESCRIPTION = f"""Explain where pods are and would go, and why.

Live, against a cluster:
  gpupool inspect nodes [NODE ...]
  gpupool inspect pod [NAMESPACE/]NAME
  gpupool inspect groups

{VIEWS_HELP}

{CONNECTION_HELP}
The options below may come before or after the view's name.

Offline, from files:
  gpupool inspect --nodes CLUSTER.yaml --pod POD.yaml [--running WORKLOAD.yaml]
  explains, node by node, whether the pod fits (with the policy's score and the
  GPUs it would take) or why not. The cluster file is gpupool YAML or an Alibaba
  node-list CSV, as gpupool simulate reads them; --running places a workload first.

Exit code: 0 when the view was printed or (offline) some node fits; 1 when the pod
does not exist or (offline) no node fits; 2 on bad input, a kubeconfig that cannot
be used, or a failed API call."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("inspect", help="explain where pods are and would go, and why "
                              "(live cluster or files)", description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    offline = p.add_argument_group("offline, from files")
    offline.add_argument("--nodes", type=Path, metavar="FILE",
                         help="cluster: gpupool YAML or Alibaba node-list CSV")
    offline.add_argument("--pod", type=Path, metavar="FILE",
                         help="a Kubernetes Pod manifest (YAML or JSON)")
    offline.add_argument("--running", type=Path, metavar="FILE",
                         help="pods to place first (gpupool YAML or Alibaba pod CSV)")
    offline.add_argument("--json", action="store_const", dest="output", const="json",
                         default=argparse.SUPPRESS,
                         help="the same as -o json (with -o too, the last one given wins)")
    offline.add_argument("--limit", type=bounded(int, 0), default=DEFAULT_LIMIT, metavar="N",
                         help=f"list at most N nodes in the table, the best first, and count "
                              f"the others by their reason (default {DEFAULT_LIMIT}; 0: every "
                              f"node; -o json and yaml always hold every node)")
    p.add_argument("--policy", default=DEFAULT_POLICY, metavar="NAME",
                   help=f"placement policy that scores the nodes a pod fits (default "
                        f"{DEFAULT_POLICY}; known: {', '.join(sorted(POLICIES))})")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed for ties and policies that draw (default 0)")
    add_options(p.add_argument_group("live, against a cluster"))
    views = p.add_subparsers(dest="view", metavar="VIEW", title="live views")
    for view in add_views(views, copies=True):
        _one_line_errors(view)
    p.set_defaults(func=inspect)
    _one_line_errors(p)


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """A bad flag prints one line and exits 2 (not argparse's usage block)."""
    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: {message} (see --help)\n")

    parser.error = error  # type: ignore[method-assign]


def read_pod(path: Path) -> Mapping[str, Any]:
    """The one Pod in a YAML or JSON file, every field on the paths gpupool reads checked
    against Kubernetes' Pod schema (``gpupool.contract.podshape``)."""
    if not path.is_file():
        raise InvalidInput(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")[:MAX_POD_BYTES + 1]
    except (OSError, UnicodeDecodeError) as exc:
        one_line = " ".join(str(exc).split())
        raise InvalidInput(f"{path}: not a readable YAML or JSON Pod ({one_line})") from None
    if len(text) > MAX_POD_BYTES:
        raise InvalidInput(f"{path}: larger than {MAX_POD_BYTES} bytes; not a Pod manifest")
    doc = _checked_pod(text, path)
    if doc is None:
        raise InvalidInput(f"{path}: empty (no YAML or JSON document, only blank lines or "
                           "comments); expected one Pod")
    if not isinstance(doc, Mapping):
        raise InvalidInput(f"{path}: expected one Pod object, got {type(doc).__name__}")
    return doc


def _checked_pod(text: str, path: Path) -> Any:
    """The decoded manifest; a kind other than Pod is named before its fields are."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None  # load_text below says where
    if doc is not None and not isinstance(doc, Mapping):
        raise InvalidInput(f"{path}: expected one Pod object, got {type(doc).__name__}")
    if isinstance(doc, Mapping) and doc.get("kind", "Pod") != "Pod":
        raise InvalidInput(f"{path}: kind is {doc.get('kind')!r}; inspect takes a Pod "
                           "(take the pod template out of a Deployment or Job)")
    return load_text(text, str(path), POD, yaml.SafeLoader, yaml.YAMLError)


@dataclass(frozen=True, slots=True)
class Cluster:
    """The cluster to explain against: its state, classes, and how ``--running`` went."""

    state: ClusterState
    catalogue: Catalogue
    placed: int = 0
    unplaced: tuple[str, ...] = ()


def build_cluster(nodes_path: Path, running: Path | None, placer: Placer, seed: int) -> Cluster:
    """The cluster of ``nodes_path`` with the pods of ``running`` placed, in order."""
    nodes, classes = read_cluster(nodes_path)
    state = ClusterState(nodes)
    catalogue = Catalogue(classes=ClassCatalog(classes))
    rng = random.Random(seed)
    unplaced: list[str] = []
    for pod in read_pods(running) if running is not None else []:
        constraints = constraints_for(state, pod.request, catalogue)
        placed = placer.decide(state, pod.request, rng, constraints)
        if placed.allocation is None:
            unplaced.append(pod.request.key)
        else:
            state.reserve(placed.allocation)
    return Cluster(state, catalogue, len(state.allocations), tuple(unplaced))


def inspect(args: argparse.Namespace) -> int:
    if args.nodes is None or args.pod is None:
        raise InvalidInput("name a live view (nodes, pod [NAMESPACE/]NAME, groups), or give "
                           "--nodes FILE and --pod FILE to explain offline")
    check_policies([args.policy])
    pod = read_pod(args.pod)
    request = pod_request(pod)
    workload = TargetWorkload.from_requests([request])
    placer = Placer(make_policy(args.policy, PolicyConfig(workload)))
    cluster = build_cluster(args.nodes, args.running, placer, args.seed)
    found, blocked = verdicts(cluster.state, request, cluster.catalogue, placer,
                              random.Random(args.seed))
    output = args.output
    if output != "table":
        report = as_json(request, args.policy, found, blocked)
        report["running"] = {"placed": cluster.placed, "unplaced": list(cluster.unplaced)}
        print(json.dumps(report, indent=2, ensure_ascii=False) if output == "json" else
              yaml.safe_dump(report, sort_keys=False, allow_unicode=True), end="\n" if
              output == "json" else "")
    else:
        console = screen()
        shown = table(request, args.policy, found, blocked, args.limit)
        show(console, shown)
        left = ordered(found)[shown.row_count:]
        if left:
            console.print(left_out(left))
        if args.running is not None:
            screen(stderr=True).print(
                f"--running: {cluster.placed} pods placed first, {len(cluster.unplaced)} did "
                "not fit" + _first_few(cluster.unplaced))
    return 0 if any(v.allocation is not None for v in found) else 1


def _first_few(keys: Sequence[str], n: int = 5) -> str:
    if not keys:
        return ""
    return f" ({', '.join(keys[:n])}{', …' if len(keys) > n else ''})"


def as_json(request: PodRequest, policy: str, found: Sequence[NodeVerdict],
            blocked: Reason | None) -> dict[str, Any]:
    chosen = next((v.node for v in found if v.chosen), None)
    return {
        "pod": request.key, "request": request.describe(), "policy": policy, "chosen": chosen,
        "blocked": blocked.message if blocked is not None else None,
        "nodes": nodes_json(found),
    }


def table(request: PodRequest, policy: str, found: Sequence[NodeVerdict],
          blocked: Reason | None, limit: int = 0) -> Table:
    """The nodes, best first: those that fit with the GPUs they would give, then those that
    do not with why; at most ``limit`` of them (0: all)."""
    fitting = sum(v.allocation is not None for v in found)
    caption = (f"refused before any node: {blocked.message}" if blocked is not None
               else f"{fitting} of {len(found)} nodes fit; ★ = the node {policy} picks")
    t = Table(title=f"{request.key}: {request.describe()}; policy {policy}", caption=caption)
    t.add_column("node")
    t.add_column("fits", justify="center", no_wrap=True)
    t.add_column("score", justify="right")
    t.add_column("GPUs it would take / why not")
    listed = ordered(found)
    for v in listed[:limit] if limit else listed:
        if v.allocation is not None:
            t.add_row(v.node, "★ yes" if v.chosen else "yes", f"{v.score:.4g}",
                      slices_text(v.allocation).replace(", ", "\n"))  # a GPU a line
        else:
            why = v.reason.message if v.reason is not None else "does not fit"
            t.add_row(v.node, "no", "", why)
    return t


def left_out(rest: Sequence[NodeVerdict]) -> str:
    """One line per reason for the nodes the table did not list: how many fit, and how
    many do not for each reason (``Reason.common``: the same words for every node)."""
    fit = sum(v.allocation is not None for v in rest)
    why = Counter(v.reason.common() if v.reason is not None else "does not fit"
                  for v in rest if v.allocation is None)
    lines = [f"{len(rest)} more nodes not listed (--limit 0 lists every node):"]
    if fit:
        lines.append(f"  {fit} fit")
    lines += [f"  {n} do not: {reason}" for reason, n in why.most_common()]
    return "\n".join(lines)
