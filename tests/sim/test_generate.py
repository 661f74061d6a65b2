"""Generated workloads: each mix bends the published trace mix the way it says, reproducibly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.sim.generate import MIXES_FILE, WorkloadMix, find_mix, read_mixes, scenario
from gpupool.sim.scenario import Scenario
from gpupool.sim.synthetic import CPU_MILLI_LADDER, ladder_mean

NODES = 300
"""A quarter of the published cluster: enough pods for the proportions, fast to draw."""


def generated(name: str) -> Scenario:
    return scenario(find_mix(name), NODES)


def share(scenario: Scenario, test: object) -> float:
    pods = [p.request for p in scenario.pods]
    return sum(1 for r in pods if test(r)) / len(pods)  # type: ignore[operator]


def test_the_shipped_mix_file_reads_and_names_every_kind_of_workload() -> None:
    mixes = read_mixes()
    assert next(iter(mixes)) == "base"
    assert {"spec-scarce-10", "spec-scarce-20", "spec-scarce-40", "spec-plentiful-20",
            "spec-plentiful-40", "spec-mixed-30", "multigpu-heavy", "share-heavy",
            "cpu-heavy", "cpu-only-heavy", "memory-heavy"} <= set(mixes)
    assert all(m.about for m in mixes.values())


def test_a_mix_runs_on_the_published_cluster_and_is_the_same_draw_every_time() -> None:
    full = scenario(find_mix("base"))
    assert (len(full.nodes), full.gpu_capacity_milli) == (1213, 6_212_000)
    assert len(full.pods) == 8152
    again = scenario(find_mix("base"))
    assert [p.request for p in full.pods] == [p.request for p in again.pods]


def test_the_constrained_share_and_its_model_lists_are_honoured() -> None:
    s = generated("spec-scarce-20")
    gpu_pods = [p.request for p in s.pods if p.request.gpus]
    bound = [r for r in gpu_pods if r.models is not None]
    assert 0.17 <= len(bound) / len(gpu_pods) <= 0.23
    lists = Counter(r.models for r in bound)
    assert set(lists) <= {frozenset({"T4"}), frozenset({"P100"}), frozenset({"G3"}),
                          frozenset({"V100M16", "V100M32"})}
    assert lists[frozenset({"T4"})] > lists[frozenset({"P100"})]
    assert share(generated("base"), lambda r: r.models is not None) == 0.0


def test_a_bound_multi_gpu_pod_names_only_models_with_nodes_that_wide() -> None:
    s = scenario(find_mix("spec-scarce-40"))  # T4 nodes have 2 or 4 GPUs, P100 nodes 1 or 2
    widest: dict[str, int] = {}
    for n in s.nodes:
        widest[n.model] = max(widest.get(n.model, 0), len(n.gpus))
    for p in s.pods:
        r = p.request
        if r.gpus and r.models is not None:
            assert max(widest[m] for m in r.models) >= r.gpus[0].count, r


@pytest.mark.parametrize(("name", "measure", "low", "high"), [
    ("multigpu-heavy", lambda r: r.gpus and r.gpus[0].count > 1, 0.04, 0.08),
    ("share-heavy", lambda r: r.gpus and not r.gpus[0].exclusive, 0.58, 0.70),
    ("cpu-only-heavy", lambda r: not r.gpus, 0.32, 0.40),
], ids=["multi-GPU pods are about 5 % of pods (published 0.9 %)",
        "sharing pods are about 64 % of pods (published 38 %)",
        "CPU-only pods are about 36 % of pods (published 13 %)"])
def test_class_weights_set_the_pod_mix(name: str, measure: object, low: float,
                                       high: float) -> None:
    assert low <= share(generated(name), measure) <= high


def test_cpu_and_memory_scales_multiply_every_pods_asks_up_to_the_largest_node() -> None:
    base, cpu, memory = (generated(n) for n in ("base", "cpu-heavy", "memory-heavy"))
    mean_cpu = sum(p.request.cpu_milli for p in cpu.pods) / len(cpu.pods)
    assert mean_cpu == pytest.approx(1.5 * ladder_mean(CPU_MILLI_LADDER), rel=0.08)
    assert max(p.request.cpu_milli for p in cpu.pods) <= max(n.cpu_milli for n in cpu.nodes)
    ratio = sum(p.request.memory_mib for p in memory.pods) / sum(
        p.request.memory_mib for p in base.pods)
    assert 1.6 <= ratio <= 1.9
    assert max(p.request.memory_mib for p in memory.pods) <= max(n.memory_mib for n in memory.nodes)


@pytest.mark.parametrize(("text", "message"), [
    ("mixes: []", "no mixes"),
    ("mixes: [{about: x}]", "mixes.yaml:1:9: mixes[0]: missing required key 'name'"),
    ("mixes: [{name: a}, {name: a}]", "mixes[1]: mix 'a' appears twice"),
    ("mixes: [{name: a, colour: red}]", "mixes.yaml:1:19: unknown key 'colour' in mixes[0]"),
    ("mixes: [{name: a, constrained: 0.5}]", "constrained pods need a models list"),
    ("mixes: [{name: a, constrained: 2, models: {T4: 1}}]", "constrained must be within 0..1"),
    ("mixes: [{name: a, models: {H100: 1}}]", "mixes[0].models.H100: unknown GPU model 'H100'"),
    ("mixes: [{name: a, classes: {huge-gpu: 1}}]", "unknown GPU request class"),
    ("mixes: [{name: a, shares: {1500: 1}}]", "within 1..999"),
    ("mixes: [{name: a, cpu_scale: fast}]", "mixes[0].cpu_scale: expected a number"),
    ("mixes: [{name: a, pods: 2.5}]", "mixes[0].pods: expected a whole number"),
    ("mixes: [{name: a, classes: {one-gpu: 0}}]", "classes weights must be >= 0, not all zero"),
    ("mixes: [{name: a", "not valid YAML"),
], ids=["an empty file", "a nameless mix", "a name twice", "an unknown key",
        "constrained without models", "a share above one", "an unknown model",
        "an unknown class", "a whole GPU as a share", "a word for a number",
        "a fraction of a pod", "all class weights zero", "broken YAML"])
def test_a_bad_mix_file_is_refused_naming_the_entry(tmp_path: Path, text: str,
                                                    message: str) -> None:
    path = tmp_path / "mixes.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message.replace(".", r"\.").replace("[", r"\[")):
        read_mixes(path)


def test_an_unknown_mix_name_lists_the_known_ones() -> None:
    with pytest.raises(InvalidInput, match=r"no mix named 'nope'; known: base, "):
        find_mix("nope", MIXES_FILE)


def test_a_mix_bound_to_a_model_the_cluster_lacks_is_refused() -> None:
    with pytest.raises(InvalidInput, match="no node has a GPU of model A100"):
        scenario(WorkloadMix("a", constrained=0.5, models=((frozenset({"A100"}), 1.0),)))
