"""The options and views of the live ``gpupool inspect`` and of ``kubectl gpupool``.

Only the flags: the views run in ``inspect_live``, imported when one runs, so that
``--help`` and a bad flag do not wait for the Kubernetes client, numpy or the tables.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpupool.cli.args import bounded, later
from gpupool.cli.defaults import DEFAULT_POLICY, POLICY_NAMES

GPUPOOL_NAMESPACE = "gpupool-system"
OUTPUTS = ("table", "json", "yaml")

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
    def view(name: str, run: str, text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = subparsers.add_parser(
            name, help=text, description=text + "\n\n" + CONNECTION_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_options(p, copy=copies)
        p.set_defaults(func=later("gpupool.cli.inspect_live", run))
        return p

    nodes = view("nodes", "run_nodes", "GPU nodes: GPUs, health, isolation, allocation, "
                 "holders, fragmentation")
    nodes.add_argument("names", nargs="*", metavar="NODE", help="only these nodes")
    pod = view("pod", "run_pod", "one pod: gpupool's decision, its signature, why it does or "
               "does not fit")
    pod.add_argument("ref", metavar="[NAMESPACE/]NAME", help="the pod")
    pod.add_argument("-n", "--namespace", metavar="NS",
                     help="the pod's namespace (default: the context's namespace)")
    pod.add_argument("--policy", default=argparse.SUPPRESS, metavar="NAME",
                     help=f"placement policy that scores the nodes a pending pod fits "
                          f"(default {DEFAULT_POLICY}, as the extender's; known: "
                     f"{', '.join(POLICY_NAMES)})")
    pod.add_argument("--seed", type=int, default=argparse.SUPPRESS, metavar="N",
                     help="seed for ties (default 0)")
    groups = view("groups", "run_groups", "resource groups and quotas (used / limit), usage per "
                  "namespace")
    return [nodes, pod, groups]
