"""docs/cli.md lists every command and flag as the parsers define them."""

from __future__ import annotations

from .cli_reference import BEGIN, DOC, END, commands, reference, with_reference


def test_the_reference_in_docs_cli_is_what_the_parsers_say() -> None:
    current = DOC.read_text(encoding="utf-8")
    assert BEGIN in current and END in current
    assert with_reference(current) == current, (
        "docs/cli.md is out of date: run `python -m tests.cli.cli_reference --write`")


def test_the_reference_names_every_command() -> None:
    made = reference()
    names = [name for name, _, _ in commands()]
    assert {"gpupool simulate", "gpupool extender", "gpupool device-plugin",
            "gpupool controller", "gpupool webhook", "gpupool inspect", "gpupool keys",
            "kubectl gpupool"} <= set(names)
    assert all(f"### `{name}`" in made for name in names)
