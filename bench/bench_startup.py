"""CPU time ``gpupool`` takes to start: ``--help`` and errors found before any work.

    .venv/bin/python bench/bench_startup.py [--tries 5] [--before REV ...]

Runs each command ``--tries`` times as a process, from several copies of the source: each
``--before`` revision (``git archive``; default two: the commit before the command line
imported only the module of the command being run, and the commit before the servers,
the node agent and the slice commands checked their flags and files before loading what
serving needs) and AFTER, this working tree; all with the same interpreter and installed
libraries, one after the other, in this one run. Prints per command the median CPU time
(user + system, ``resource.getrusage`` of the finished child) of each and the ratio of
each before to after; ``–`` where a revision has no such command. CPU time, not wall
time, so a busy machine changes the figures less; the first try of each also warms the
file cache. Each command must end the same way everywhere (its exit code): one that does
not is marked ``!``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPUPOOL = "import sys; from gpupool.cli.main import main; sys.exit(main())"
KUBECTL = "import sys; from gpupool.cli.kubectl import main; sys.exit(main())"
SLICE = ("--pod-uid", "u1", "--pod-name", "lab/train", "--container", "main", "--gpu-uuid",
         "GPU-0", "--memory-mib", "1024", "--core-pct", "20")
GPUS = "gpus:\n  - {uuid: GPU-0, model: Tesla-T4, memoryMiB: 15360}\n"
"""A fake GPU file the node agent accepts (written beside the runs as gpus.yaml)."""


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    what: str
    kubectl: bool = False  # ``kubectl-gpupool`` (``kubectl gpupool``), not ``gpupool``

    @property
    def module(self) -> str:
        """The module that must exist in a revision for it to have this command."""
        if self.kubectl:
            return "kubectl"
        word = next((w for w in self.argv if not w.startswith("-")), "main")
        return word.replace("-", "_")

    @property
    def label(self) -> str:
        """The program, the command and what goes wrong (the whole line: ``COMMANDS``)."""
        word = next((w for w in self.argv if not w.startswith("-")), self.argv[0])
        what = "" if self.what == "help" else f" ({self.what})"
        return f"{'kubectl gpupool' if self.kubectl else 'gpupool'} {word}{what}"


COMMANDS: tuple[Command, ...] = (
    Command(("--help",), "help"),
    Command(("simulate", "--policy", "bestfit"), "misspelt policy"),
    Command(("simulate", "--nodes", "absent.csv", "--pods", "absent.csv"), "no such file"),
    Command(("controller", "--once", "--kubeconfig", "absent.yaml"), "no kubeconfig"),
    Command(("inspect", "--nodes", "absent.yaml", "--pod", "absent.yaml"), "no such file"),
    Command(("controller", "--resync-seconds", "0"), "bad flag value"),
    Command(("extender", "--port", "0"), "bad flag value"),
    Command(("extender", "--policy", "bestfit"), "unknown policy"),
    Command(("extender", "--kubeconfig", "absent.yaml"), "no kubeconfig"),
    Command(("device-plugin",), "no node name"),
    Command(("device-plugin", "--node-name", "n1", "--fake-gpus", "absent.yaml"),
            "no fake GPU file"),
    Command(("device-plugin", "--node-name", "n1", "--fake-gpus", "gpus.yaml",
             "--kubeconfig", "absent.yaml"), "no kubeconfig"),
    Command(("webhook", "--port", "x"), "bad flag value"),
    Command(("webhook", "--kubeconfig", "absent.yaml"), "no kubeconfig"),
    Command(("mps-helper", "--socket"), "bad flag value"),
    Command(("mps-helper", "--fake-gpus", "absent.yaml"), "no fake GPU file"),
    Command(("slice-server", *SLICE, "--core-pct", "200", "--credentials-dir", "absent"),
            "bad flag value"),
    Command(("slice-server", *SLICE, "--credentials-dir", "absent"), "no credentials"),
    Command(("slice-client", "--pod-uid", "u1", "--slice-server", "bad", "--credentials-dir",
             "absent"), "bad flag value"),
    Command(("slice-client", "--pod-uid", "u1", "--slice-server", "10.0.3.7:14900",
             "--credentials-dir", "absent"), "no credentials"),
    Command(("--help",), "help", kubectl=True),
)
"""``--help``, and errors that need no heavy library or only the one that checks them:
misspelt flags and policies, missing files, kubeconfigs and credentials."""


def oldest(*log_args: str) -> str:
    """The oldest commit ``git log log_args`` lists."""
    found = subprocess.run(["git", "log", "--format=%H", *log_args], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    if not found:
        raise SystemExit(f"bench_startup: no commit matches git log {' '.join(log_args)}; "
                         "give --before")
    return found[-1]


def default_baselines() -> list[str]:
    """Before the command line imported only the chosen command's module; before the
    servers checked their flags and files ahead of what serving needs."""
    lazy = oldest("-S", "COMMANDS: dict[str, str]", "--", "src/gpupool/cli/main.py")
    flags_first = oldest("--diff-filter=A", "--", "src/gpupool/cli/extender_run.py")
    return [f"{lazy}^", f"{flags_first}^"]


def checkout(rev: str, into: Path) -> Path:
    """``src/`` of ``rev``, unpacked into ``into``."""
    data = subprocess.run(["git", "archive", rev, "src"], cwd=REPO, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_once(src: Path, command: Command, cwd: Path) -> tuple[float, int]:
    """CPU seconds and exit code of one process running ``command`` from ``src``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", KUBECTL if command.kubectl else GPUPOOL,
                           *command.argv], cwd=cwd, capture_output=True, check=False,
                          timeout=120, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin",
                                            "HOME": str(cwd)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), \
        proc.returncode


def median(src: Path, command: Command, tries: int, cwd: Path) -> tuple[float, int] | None:
    """The median CPU seconds and the exit code (of the last try); None when ``src`` has
    no such command."""
    if not (src / "gpupool" / "cli" / f"{command.module}.py").exists():
        return None
    runs = [run_once(src, command, cwd) for _ in range(tries)]
    return statistics.median(cpu for cpu, _ in runs), runs[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--before", action="append", metavar="REV",
                        help="a revision to compare with, repeatable (default: the commit "
                             "before lazy start-up and the one before the servers checked "
                             "their flags first)")
    args = parser.parse_args()
    revisions = args.before or default_baselines()
    with tempfile.TemporaryDirectory() as tmp:
        sources = [checkout(rev, Path(tmp) / f"before{k}") for k, rev in enumerate(revisions)]
        work = Path(tmp) / "work"
        work.mkdir()
        (work / "gpus.yaml").write_text(GPUS)
        for k, rev in enumerate(revisions):
            print(f"before {k + 1}: {rev}")
        print(f"after: this working tree; median of {args.tries} tries; CPU seconds "
              "(user + system)")
        heads = "".join(f" {f'before {k + 1}':>9}" for k in range(len(revisions)))
        ratios = "".join(f" {f'b{k + 1}/after':>8}" for k in range(len(revisions)))
        print(f"{'command':<44}{heads} {'after':>7}{ratios}")
        for command in COMMANDS:
            old = [median(src, command, args.tries, work) for src in sources]
            new = median(REPO / "src", command, args.tries, work)
            assert new is not None
            cells = "".join(f" {'–':>9}" if o is None else
                            f" {o[0]:8.3f}{'!' if o[1] != new[1] else ' '}" for o in old)
            times = "".join(f" {'–':>8}" if o is None else f" {o[0] / new[0]:7.1f}x"
                            for o in old)
            print(f"{command.label:<44}{cells} {new[0]:7.3f}{times}")


if __name__ == "__main__":
    main()
