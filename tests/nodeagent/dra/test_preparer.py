"""The preparer on its own (no gRPC, no HTTP): the node state it re-checks against follows
the prepared claims exactly, prepare after prepare."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from gpupool.contract import dra
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.checkpoint import Checkpoint
from gpupool.nodeagent.dra.preparer import ClaimRefused, PrepareConfig, Preparer
from gpupool.nodeagent.exposure import Exposure
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.isolation.none import NoIsolation

from ..builders import NODE, write_gpus
from .builders import NAMESPACE, allocated_claim


class Claims:
    """An in-memory claim source (the API server is not what is tested here)."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.claims[name]

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


def snapshot(p: Preparer) -> tuple[Any, ...]:
    state = p._state()
    return (state.usage(), state.unit_free.tolist(), state.core_free.tolist(),
            sorted(state.allocations))


def test_the_state_rechecked_against_is_the_one_rebuilt_from_the_prepared_claims(
        tmp_path: Path) -> None:
    gpus = FakeGpuBackend(write_gpus(tmp_path / "gpus.yaml", 2, 16384)).discover()
    source = Claims()
    p = Preparer(PrepareConfig(NODE), source, lambda: gpus, Checkpoint(tmp_path / "claims"),
                 CdiSpecs(tmp_path / "cdi"), Exposure(), NoIsolation())
    rng = random.Random(7)
    refused = 0
    for i in range(120):
        if p.claims and rng.random() < 0.4:
            p.unprepare(rng.choice(sorted(p.claims)))
        else:
            name = f"c{i}"
            source.claims[name] = allocated_claim(name, [dra.device_name(rng.randrange(2))],
                                                  memory=f"{rng.choice([1, 2, 4])}Gi",
                                                  cores=str(rng.choice([5, 20, 40])))
            try:
                p.prepare(NAMESPACE, name, f"uid-{name}")
            except ClaimRefused as exc:
                assert "cannot serve" in str(exc)
                refused += 1
        followed = snapshot(p)
        p._cached = None
        assert followed == snapshot(p)
    assert refused and len(p.claims) > 2  # both full GPUs and prepared claims were met
