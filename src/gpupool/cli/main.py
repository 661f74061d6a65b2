"""``gpupool`` command line: one subcommand per module in this package.

Each subcommand module exposes ``register(subparsers)``, which adds its parser
and sets ``func`` (taking the parsed ``argparse.Namespace``, returning an exit
code). The list below is the explicit registry; nothing registers itself.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from gpupool import __version__
from gpupool.cli.args import one_line_errors
from gpupool.core.errors import GpupoolError
from gpupool.kube import kubeconfig

SUBCOMMANDS: tuple[str, ...] = ("simulate", "device_plugin", "extender", "controller", "inspect",
                               "webhook", "keys")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupool", description="Share and pack the GPUs of a Kubernetes cluster."
    )
    parser.add_argument("--version", action="version", version=f"gpupool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"gpupool.cli.{name}").register(sub)
    one_line_errors(parser)
    return parser


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except kubeconfig.KubeconfigError as exc:
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
