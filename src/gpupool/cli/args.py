"""Argument types and checks several subcommands share.

Light on purpose (every command's parser is built from here before it runs): the
policy and weight checks import the core when they are called.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from gpupool.contract.yamlcheck import closest
from gpupool.core.errors import InvalidInput, UnknownName

N = TypeVar("N", int, float)


def bounded(kind: type[N], low: float, high: float = math.inf, *, above: bool = False
            ) -> Callable[[str], N]:
    """An argparse type: a number of ``kind`` (``int``: whole) from ``low`` (``above``:
    more than ``low``) to ``high``, refused with the bounds in the message."""
    noun = "a whole number" if kind is int else "a number"
    if high == math.inf:
        limits = f"above {low:g}" if above else f"of at least {low:g}"
    else:
        limits = f"above {low:g} and at most {high:g}" if above else \
            f"from {low:g} to {high:g}"

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
        if not (low < value if above else low <= value) or not value <= high:  # NaN: False
            raise argparse.ArgumentTypeError(f"expected {noun} {limits}, got {text}")
        return value
    return parse


def weight(text: str) -> tuple[str, float]:
    """``--weight NAME=NUMBER`` (a policy weight, e.g. ``fgd-balance.lambda=0.5``)."""
    name, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not name.strip() or number is None:
        raise argparse.ArgumentTypeError(
            f"--weight takes NAME=NUMBER (e.g. fgd-balance.lambda=0.5), got {text!r}")
    return name.strip(), number


def later(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """A command's ``func``: ``module.function``, imported when the command runs, so that
    building the parser (``--help``, a bad flag) does not load what running it needs."""
    def run(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module), function)(args))
    return run


NEAR = 0.5
"""How like a known name (difflib's ratio) a mistyped policy or weight must be to be
offered in its place (``closest``, the rule YAML keys follow too)."""


def check_policies(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` without repeats, or ``UnknownName`` for the first that is no policy, with
    the closest policy name (one line)."""
    from gpupool.core.policies import POLICIES  # numpy: only once a command runs

    for name in names:
        if name not in POLICIES:
            near = closest(name, sorted(POLICIES), NEAR)
            hint = f"did you mean {near}? " if near else ""
            raise UnknownName(f"--policy {name}: no such policy ({hint}known: "
                              f"{', '.join(sorted(POLICIES))})")
    return tuple(dict.fromkeys(names))


class _Asked(dict[str, float]):
    """A weights map that remembers every name a policy asks it for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)


@functools.cache
def weight_names(policy: str) -> frozenset[str]:
    """The weights ``policy`` reads: asked of the policy itself, built on a one-pod
    workload, so the list is always the code's own."""
    from gpupool.core.policies import make_policy
    from gpupool.core.policies.config import PolicyConfig
    from gpupool.core.request import GpuDemand, Mode, PodRequest
    from gpupool.core.workload import TargetWorkload

    probe = TargetWorkload.from_requests(
        [PodRequest("probe", 1000, 1024, (GpuDemand(1, 1024, 50, Mode.SHARED),))])
    asked = _Asked()
    make_policy(policy, PolicyConfig(probe, asked))
    return frozenset(asked.asked)


def check_weights(weights: Sequence[tuple[str, float]], policies: Sequence[str]) -> None:
    """Refuse a ``--weight`` no policy of ``policies`` reads, naming the closest name
    and the policy that reads it (``InvalidInput``, one line)."""
    from gpupool.core.policies import POLICIES

    used = {name: p for p in policies for name in weight_names(p)}
    every = {name: p for p in sorted(POLICIES) for name in weight_names(p)}
    for name, _ in weights:
        if name in used:
            continue
        if name in every:
            raise InvalidInput(f"--weight {name}: only policy {every[name]} reads it, and it "
                               f"is not run (--policy {every[name]})")
        near = closest(name, sorted(used or every), NEAR)
        hint = f"did you mean {near}?" if near else \
            f"weights of {', '.join(policies)}: {', '.join(sorted(used)) or 'none'}"
        raise InvalidInput(f"--weight {name}: no such weight ({hint})")


class _Deprecated(argparse.Action):
    """A hidden old spelling of a flag: stores into the new flag's place and says, in one
    line on stderr, which name to use instead."""

    def __init__(self, option_strings: Sequence[str], dest: str, instead: str = "",
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated; use {self.instead}",
              file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Accept ``old`` (hidden from --help) as the earlier name of the flag ``new``."""
    current = next(a for a in parser._actions if new in a.option_strings)
    like: dict[str, Any] = {"nargs": current.nargs, "const": current.const,
                            "metavar": current.metavar}
    if current.type is not None:
        like["type"] = current.type
    parser.add_argument(old, action=_Deprecated, dest=current.dest, instead=new,
                        help=argparse.SUPPRESS, default=argparse.SUPPRESS, **like)


KUBECONFIG_HELP = ("kubeconfig file (default: as kubectl finds it: $KUBECONFIG, else "
                   "~/.kube/config, else the pod's service account)")
SERVER_HELP = argparse.SUPPRESS
"""``--server URL``: a bare API server URL, no credentials — for tests and local fakes;
hidden from --help in every command."""


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def add_log_level(parser: argparse.ArgumentParser | Any) -> None:
    """``--log-level``, the same in every long-running command."""
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                        metavar="LEVEL",
                        help=f"how much to log: {', '.join(LOG_LEVELS)} (default INFO)")


def user_text(doc: str | None) -> str:
    """A module docstring as --help shows it: without reST's double backticks."""
    return (doc or "").replace("``", "")


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """A bad flag prints one line naming the command, and exits 2 (not argparse's usage
    block): set on ``parser`` and every parser below it."""
    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: {message} (see --help)\n")

    parser.error = error  # type: ignore[method-assign]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                one_line_errors(child)
