"""The command reference of docs/cli.md, made from the parsers themselves.

``python -m tests.cli.cli_reference --write`` rewrites the part of docs/cli.md between
its markers; ``tests/cli/test_cli_doc.py`` fails when that part differs from what the
parsers say (a flag added, renamed or re-worded without the doc).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from gpupool.cli import kubectl
from gpupool.cli.main import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
BEGIN = "<!-- reference: made by `python -m tests.cli.cli_reference --write`; do not edit -->"
END = "<!-- end of reference -->"


def commands() -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, one-line help) of every command and subcommand, in order."""
    def walk(name: str, parser: argparse.ArgumentParser, summary: str
             ) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
        yield name, parser, summary
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help or "" for a in action._choices_actions}
                for sub, child in action.choices.items():
                    yield from walk(f"{name} {sub}", child, helps.get(sub, ""))
    root = build_parser()
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for sub, child in action.choices.items():
                yield from walk(f"gpupool {sub}", child, helps.get(sub, ""))
    yield from walk("kubectl gpupool", kubectl.build_parser(),
                    "the live inspect views as a kubectl plugin")


def flag_line(action: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.nargs != 0 and not isinstance(action, argparse.BooleanOptionalAction):
        metavar = action.metavar or (
            "{" + ",".join(map(str, action.choices)) + "}" if action.choices
            else action.dest.upper())
        names += f" `{metavar}`"
    text = " ".join((action.help or "").split())
    return f"* {names} — {text}"


def positional_line(action: argparse.Action) -> str:
    return f"* `{action.metavar or action.dest}` — {' '.join((action.help or '').split())}"


def reference() -> str:
    lines: list[str] = []
    for name, parser, summary in commands():
        lines += ["", f"### `{name}`", ""]
        if summary:
            lines += [summary[0].upper() + summary[1:] + ".", ""]
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(
                    action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            lines.append(flag_line(action) if action.option_strings
                         else positional_line(action))
    return "\n".join(lines).strip() + "\n"


def with_reference(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n\n{reference()}\n{END}{tail}"


if __name__ == "__main__":
    current = DOC.read_text(encoding="utf-8")
    made = with_reference(current)
    if "--write" in sys.argv[1:]:
        DOC.write_text(made, encoding="utf-8")
    else:
        sys.stdout.write(reference())
