"""Every flag of every command speaks to users: it has help with its default and unit, one
concept has one spelling across commands (old spellings stay as hidden aliases that
warn), and no help text shows reST backticks or gpupool's internal class names."""

from __future__ import annotations

import argparse
import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpupool.cli import kubectl
from gpupool.cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[2]
UNIT_SUFFIXES = ("-seconds", "-mib", "-pct", "-port", "-ms")
UNIT_METAVARS = frozenset({"SECONDS", "DURATION", "MIB", "PCT", "PORT", "N", "X", "NAME=X"})
RENAMED = {"--api-server": "--server", "--memory-unit-mib": "--memory-unit"}
"""Old spellings: hidden, still accepted, with a one-line warning."""
KUBERNETES_KINDS = frozenset({
    "Pod", "Node", "Secret", "ConfigMap", "Service", "Lease", "Event", "Binding",
    "PodDisruptionBudget", "PodDisruptionBudgets", "ResourceQuota", "ResourceSlice",
    "ResourceSlices", "ResourceClaim", "ResourceClaims", "DeviceClass", "DeviceClasses",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "PriorityClass"})


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    def walk(name: str, parser: argparse.ArgumentParser
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    yield from walk(f"{name} {sub}", child)
    yield from walk("gpupool", build_parser())
    yield from walk("kubectl gpupool", kubectl.build_parser())


def visible_flags() -> Iterator[tuple[str, argparse.Action]]:
    for name, parser in parsers():
        for action in parser._actions:
            if action.option_strings and action.help != argparse.SUPPRESS and not isinstance(
                    action, argparse._HelpAction | argparse._VersionAction):
                yield name, action


def has_default(action: argparse.Action) -> bool:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return False
    return action.default not in (None, False, [], argparse.SUPPRESS)


def test_every_flag_has_help_naming_its_default() -> None:
    missing = [f"{name} {action.option_strings[-1]}" for name, action in visible_flags()
               if not action.help or (has_default(action) and "default" not in action.help)]
    assert missing == []


def test_every_number_flag_names_its_unit() -> None:
    unitless = [f"{name} {a.option_strings[-1]}" for name, a in visible_flags()
                if isinstance(a.default, int | float) and not isinstance(a.default, bool)
                and not a.option_strings[-1].endswith(UNIT_SUFFIXES)
                and a.metavar not in UNIT_METAVARS]
    assert unitless == []


def concept(flag: str) -> str:
    """A flag's name without its unit and without an ``api-`` prefix: two flags of one
    concept spelt differently come out the same."""
    name = flag.removeprefix("--").removeprefix("api-")
    for suffix in UNIT_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def test_one_concept_has_one_spelling_across_commands() -> None:
    spellings: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for name, action in visible_flags():
        for flag in action.option_strings:
            if flag.startswith("--"):
                spellings[concept(flag)][flag].add(name)
    twice = {c: dict(s) for c, s in spellings.items() if len(s) > 1}
    assert twice == {}


def test_the_concept_check_catches_the_spellings_that_were_renamed() -> None:
    assert all(concept(old) == concept(new) for old, new in RENAMED.items())


@pytest.mark.parametrize(("old", "new"), list(RENAMED.items()))
def test_an_old_spelling_is_hidden_accepted_and_warns_in_one_line(
        old: str, new: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert old not in [f for _, a in visible_flags() for f in a.option_strings]
    args = build_parser().parse_args(["device-plugin", old, "512"])
    assert getattr(args, new.removeprefix("--").replace("-", "_")) in ("512", 512)
    assert capsys.readouterr().err == f"gpupool device-plugin: {old} is deprecated; use {new}\n"


def internal_class_names() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "src" / "gpupool").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    kinds = {doc.get("spec", {}).get("names", {}).get("kind")
             for path in (REPO / "charts" / "gpupool" / "crds").glob("*.yaml")
             for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)}
    return {n for n in names if n[0].isupper() and n not in kinds | KUBERNETES_KINDS}


def test_help_texts_have_no_rest_markup_and_no_internal_class_names() -> None:
    internal = internal_class_names()
    texts = [(name, p.description or "") for name, p in parsers()]
    texts += [(f"{name} {a.option_strings[-1]}", a.help or "") for name, a in visible_flags()]
    found = [(where, word) for where, text in texts
             for word in set(re.findall(r"``|\b[A-Z][A-Za-z]+\b", text))
             if word == "``" or word in internal]
    assert found == []


def test_every_command_answers_help(capsys: pytest.CaptureFixture[str]) -> None:
    for name, _ in parsers():
        if name.startswith("kubectl"):
            continue
        with pytest.raises(SystemExit) as done:
            main([*name.split()[1:], "--help"])
        assert done.value.code == 0
    assert "usage: gpupool" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["simulate", "extender", "device-plugin", "controller",
                                     "webhook", "keys", "inspect"])
def test_a_bad_flag_value_is_one_line_naming_the_command(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--kubeconfig"])  # the flag without its value
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"gpupool {command}: "), err
