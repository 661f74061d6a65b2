"""Many runs: every (policy, seed) pair of one scenario, in-process or in a process pool.

Every policy gets the same ``PolicyConfig``: the target workload of the original
(un-inflated) pods, which FGD-type policies need and the others ignore, and the
weights given on the command line — or, with ``learn_every``, learns its
workload from the arrivals as the extender does (``gpupool.sim.learning``).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from enum import Enum

from gpupool.core.errors import InvalidInput
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.serving import ZONE_LABEL, ServingConfig
from gpupool.core.workload import TargetWorkload
from gpupool.sim.protocol import ProtocolRun, arrival_order, run_protocol
from gpupool.sim.remote import RemoteMode
from gpupool.sim.scenario import Scenario
from gpupool.sim.timed import TimedRun, run_timed
from gpupool.sim.window import ALL_NODES, nodes_to_find

Run = ProtocolRun | TimedRun
Progress = Callable[[int], None]


class SimMode(Enum):
    PROTOCOL = "protocol"
    TIMED = "timed"


@dataclass(frozen=True, slots=True)
class Campaign:
    """What to run: a scenario, policies, seeds and the protocol's inflation."""

    scenario: Scenario
    policies: tuple[str, ...]
    seeds: tuple[int, ...]
    mode: SimMode = SimMode.PROTOCOL
    inflate: float = 1.3
    weights: dict[str, float] = field(default_factory=dict)
    nodes_to_score: int = ALL_NODES  # kube-scheduler's percentageOfNodesToScore (0: adaptive)
    learn_every: float | None = None  # learn the workload online (gpupool.sim.learning)
    remote: RemoteMode = RemoteMode.OFF  # the placement every GPU pod carries (sim.remote)
    domains: tuple[str, ...] = (ZONE_LABEL,)  # topology labels remote slices prefer

    def __post_init__(self) -> None:
        if not self.policies or not self.seeds:
            raise InvalidInput("a simulation needs at least one policy and one seed")
        ServingConfig(domains=self.domains)  # refuses an empty or repeated label
        if self.remote is not RemoteMode.OFF and self.mode is not SimMode.PROTOCOL:
            raise InvalidInput("remote slices are simulated in protocol mode only "
                               "(--mode protocol)")
        if self.remote is not RemoteMode.OFF and self.nodes_to_score != ALL_NODES:
            raise InvalidInput("remote slices are simulated with every node scored "
                               "(--nodes-to-score 100)")
        if self.learn_every is not None and not self.learn_every > 0:
            raise InvalidInput(f"the learning interval must be > 0 (got {self.learn_every})")
        nodes_to_find(len(self.scenario.nodes), self.nodes_to_score)  # refuses a bad share

    @property
    def jobs(self) -> list[tuple[str, int]]:
        return [(p, s) for p in self.policies for s in self.seeds]

    def config(self) -> PolicyConfig:
        workload = TargetWorkload.from_requests(self.scenario.requests)
        return PolicyConfig(workload=workload, weights=dict(self.weights))

    def planned_pods(self) -> int:
        """Pods all runs will place (for a progress bar)."""
        if self.mode is SimMode.TIMED:
            return len(self.scenario.pods) * len(self.jobs)
        capacity = self.scenario.gpu_capacity_milli
        per_seed = [len(arrival_order(self.scenario.requests, capacity, self.inflate,
                                      random.Random(s))) for s in self.seeds]
        return sum(per_seed) * len(self.policies)


def run_one(campaign: Campaign, config: PolicyConfig, policy: str, seed: int,
            progress: Progress | None = None) -> Run:
    if campaign.mode is SimMode.TIMED:
        return run_timed(campaign.scenario, policy, seed, config, progress,
                         campaign.nodes_to_score, campaign.learn_every)
    return run_protocol(campaign.scenario, policy, seed, campaign.inflate, config, progress,
                        campaign.nodes_to_score, campaign.learn_every, campaign.remote,
                        campaign.domains)


class CampaignInterrupted(KeyboardInterrupt):
    """Ctrl-C during a campaign: the runs that finished (in job order); the rest were
    cancelled and the worker processes stopped."""

    def __init__(self, runs: list[Run], planned: int):
        super().__init__(f"{len(runs)} of {planned} runs finished")
        self.runs, self.planned = runs, planned


def run_campaign(campaign: Campaign, workers: int = 1,
                 progress: Progress | None = None) -> list[Run]:
    """All runs, ordered by (policy, seed) as given. Unknown policies fail before any run.
    Ctrl-C raises ``CampaignInterrupted`` with the finished runs, at once."""
    config = campaign.config()
    for name in campaign.policies:
        make_policy(name, config)
    jobs = campaign.jobs
    done: dict[tuple[str, int], Run] = {}
    try:
        if workers <= 1 or len(jobs) == 1:
            for p, s in jobs:
                done[(p, s)] = run_one(campaign, config, p, s, progress)
        else:
            _run_pooled(campaign, config, min(workers, len(jobs)), done, progress)
    except KeyboardInterrupt:
        raise CampaignInterrupted([done[j] for j in jobs if j in done], len(jobs)) from None
    return [done[job] for job in jobs]


def _run_pooled(campaign: Campaign, config: PolicyConfig, workers: int,
                done: dict[tuple[str, int], Run], progress: Progress | None) -> None:
    """The jobs in ``workers`` processes, into ``done``; on Ctrl-C (which the workers
    ignore) the queued jobs are cancelled and the workers terminated, not waited for."""
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_adopt,
                               initargs=(campaign, config))
    try:
        futures = [pool.submit(_run_adopted, p, s) for p, s in campaign.jobs]
        for future in as_completed(futures):
            run = future.result()
            done[(run.policy, run.seed)] = run
            if progress is not None:
                progress(run.pods)
    except BaseException:
        _terminate(set(multiprocessing.active_children()) - before)
        # the workers are gone, so this returns at once; waiting for the pool's own thread
        # keeps it from closing its pipe while the interpreter's exit writes to it
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()


def _terminate(workers: set[multiprocessing.process.BaseProcess]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(timeout=1.0)


def default_workers(jobs: int) -> int:
    """One worker per core this process may use, at most one per run."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, jobs))


_ADOPTED: list[tuple[Campaign, PolicyConfig]] = []


def _adopt(campaign: Campaign, config: PolicyConfig) -> None:
    """Worker start-up: keep the campaign, so each job ships only (policy, seed); leave
    Ctrl-C to the parent, which stops the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _ADOPTED[:] = [(campaign, config)]


def _run_adopted(policy: str, seed: int) -> Run:
    campaign, config = _ADOPTED[0]
    return run_one(campaign, config, policy, seed)


@dataclass(frozen=True, slots=True)
class PolicyStats:
    """A policy's runs, aggregated over seeds (std: sample standard deviation)."""

    policy: str
    runs: int
    mean_unallocated_gpu_pct: float | None
    std_unallocated_gpu_pct: float | None
    mean_failed_pods: float
    mean_peak_allocation_pct: float | None
    wall_s: float
    decision_median_ms: float
    mean_bounced_pods: float = 0.0
    mean_remote_slices: float = 0.0  # at the headline pod (protocol runs)
    mean_gpuless_pods: float = 0.0  # GPU pods on nodes without GPUs, at the headline pod
    mean_local_slices_pct: float = 100.0


def aggregate(runs: Sequence[Run]) -> list[PolicyStats]:
    """Per policy, in first-seen order."""
    by_policy: dict[str, list[Run]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(run)
    return [_stats(name, group) for name, group in by_policy.items()]


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return round(statistics.fmean(values), 4), round(std, 4)


def _stats(policy: str, runs: list[Run]) -> PolicyStats:
    unallocated = [r.unallocated_gpu_pct for r in runs if isinstance(r, ProtocolRun)]
    peaks = [r.peak_allocation_pct for r in runs if isinstance(r, TimedRun)]
    slices = [r.slices for r in runs if isinstance(r, ProtocolRun)]
    mean, std = _mean_std(unallocated)
    return PolicyStats(
        policy, len(runs), mean, std, round(statistics.fmean(r.failed_pods for r in runs), 2),
        _mean_std(peaks)[0], round(sum(r.wall_s for r in runs), 3),
        round(statistics.median(r.decision_median_ms for r in runs), 4),
        round(statistics.fmean(r.bounced_pods for r in runs), 2),
        _mean([float(s.remote_slices) for s in slices], 0.0),
        _mean([float(s.gpu_pods_on_gpuless_nodes) for s in slices], 0.0),
        _mean([s.local_slices_pct for s in slices], 100.0))


def _mean(values: list[float], empty: float) -> float:
    return round(statistics.fmean(values), 4) if values else empty
