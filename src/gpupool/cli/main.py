"""``gpupool`` command line: one subcommand per module in this package.

Each subcommand module exposes ``register(subparsers)``, which adds its parser
and sets ``func`` (taking the parsed ``argparse.Namespace``, returning an exit
code). ``COMMANDS`` below is the explicit registry; nothing registers itself.

Only the module of the command being run is imported (``build_parser``): a command's
module brings numpy, the Kubernetes client or the HTTP servers with it, and
``gpupool --help`` or a mistyped flag should not wait for those.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Collection, Sequence

from gpupool import __version__
from gpupool.cli.args import one_line_errors
from gpupool.core.errors import GpupoolError
from gpupool.kube.errors import KubeconfigError, KubeError

COMMANDS: dict[str, str] = {
    "simulate": "replay a workload through the placement policies",
    "device-plugin": "run the node agent (kubelet device plugin or DRA driver)",
    "extender": "serve the kube-scheduler extender",
    "controller": "reconcile gpupool's custom resources",
    "inspect": "explain where pods are and would go, and why (live cluster or files)",
    "webhook": "serve gpupool's admission webhook",
    "keys": "show, rotate or retire decision signing keys",
    "mps-helper": "set GPU compute modes for the mps isolation provider (privileged)",
    "slice-server": "serve one remote GPU slice behind mutual TLS (on the GPU node)",
    "slice-client": "the sidecar of a remote GPU slice (in the workload's pod)",
    "slice-stub": "run the stub data-plane provider (a stand-in for remote-slice tests and "
                  "demos)",
}
"""Every command and its line in ``gpupool --help`` (the module ``gpupool.cli.<command>``,
with ``_`` for ``-``, registers the same line with its full parser)."""


def build_parser(full: Collection[str] = tuple(COMMANDS)) -> argparse.ArgumentParser:
    """The parser of every command; the commands in ``full`` with their flags, the others
    as their name and help line only (their modules are not imported)."""
    parser = argparse.ArgumentParser(
        prog="gpupool", description="Share and pack the GPUs of a Kubernetes cluster."
    )
    parser.add_argument("--version", action="version", version=f"gpupool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        if name in full:
            importlib.import_module(f"gpupool.cli.{name.replace('-', '_')}").register(sub)
        else:
            sub.add_parser(name, help=summary, add_help=False)
    one_line_errors(parser)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs: its first word that is not an option (the top-level
    options take no value), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_of(argv)
    parser = build_parser({command} if command in COMMANDS else ())
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except (KubeconfigError, KubeError) as exc:  # name the command that met the cluster
        print(f"gpupool {args.command}: {exc}", file=sys.stderr)
        return 2
    except GpupoolError as exc:
        for line in str(exc).splitlines() or [""]:  # a file's problems: one line each
            print(f"gpupool: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (``| head``): stop quietly, as a shell tool does
        quiet_stdout()
        return 141
    except KeyboardInterrupt:
        print(f"gpupool {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
