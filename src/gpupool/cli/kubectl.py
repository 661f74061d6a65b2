"""``kubectl-gpupool``: the live ``gpupool inspect`` views as a kubectl plugin.

Installed as the console script ``kubectl-gpupool``; with it on ``PATH``, kubectl runs
it for ``kubectl gpupool ...`` (kubectl's plugin mechanism: an executable named
``kubectl-<name>``). The views, options and outputs are those of ``gpupool inspect``
(``inspect_live``); only the program's name and the error prefix differ.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from gpupool import __version__
from gpupool.cli.inspect_views import CONNECTION_HELP, VIEWS_HELP, add_options, add_views
from gpupool.cli.main import quiet_stdout
from gpupool.core.errors import GpupoolError

PROG = "kubectl gpupool"

DESCRIPTION = f"""Show how gpupool shares the cluster's GPUs, and why.

  kubectl gpupool nodes [NODE ...]
  kubectl gpupool pod [NAMESPACE/]NAME
  kubectl gpupool groups

{VIEWS_HELP}

{CONNECTION_HELP}
The options below may come before or after the view's name.

Exit code: 0 when the view was printed; 1 when the pod does not exist; 2 on bad
input, a kubeconfig that cannot be used, or a failed API call."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpupool {__version__}")
    add_options(parser)
    views = parser.add_subparsers(dest="view", metavar="VIEW", title="views")
    for view in [parser, *add_views(views, copies=True)]:
        _one_line_errors(view)
    return parser


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """A bad flag prints one line and exits 2 (not argparse's usage block)."""
    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: {message} (see --help)\n")

    parser.error = error  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except GpupoolError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (``| head``): stop quietly, as a shell tool does
        quiet_stdout()
        return 141
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
