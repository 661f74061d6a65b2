"""A holding that does not fit yet waits on every node it needs and is held as soon as
room frees on any of them: a remote slice's home (its CPU and memory) and its serving node
(its GPUs)."""
from __future__ import annotations

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.eligibility import Catalogue
from gpupool.core.model import Gpu, Node
from gpupool.core.state import ClusterState
from gpupool.extender.state.holdings import Holdings

GIB = 1024


def test_a_remote_slice_parked_on_its_homes_cpu_is_retried_when_that_cpu_frees() -> None:
    state = ClusterState([Node("home", 1000, 4096),
                          Node("g", 8000, 65536, (Gpu("GPU-g-0", 0, "A100", 80 * GIB),))])
    h = Holdings(state, Catalogue())
    # a pod on the home takes all of its CPU (e.g. a pod about to be seen deleted)
    assert h.hold(Allocation("cpu-pod", "home", 1000, 1024), "pod")
    # a bound remote-required pod: home "home", its slice served by g
    remote = Allocation("remote", "home", 500, 1024,
                        (Slice("GPU-g-0", 0, 80 * GIB, 100, "main"),), False, "g")
    assert not h.hold(remote, "pod")  # no CPU on its home yet: parked
    h.unhold("cpu-pod", "pod")  # the home's CPU is freed
    assert "remote" in state.allocations
    assert int(state.unit_free[state.index["g"]][0]) == 0 and not h.waiting


def test_a_remote_slice_parked_on_its_gpus_is_retried_when_a_slice_there_is_released() -> None:
    state = ClusterState([Node("home", 1000, 4096), Node("other", 1000, 4096),
                          Node("g", 8000, 65536, (Gpu("GPU-g-0", 0, "A100", 80 * GIB),))])
    h = Holdings(state, Catalogue())
    victim = Allocation("victim", "other", 100, 256,
                        (Slice("GPU-g-0", 0, 80 * GIB, 100, "main"),), False, "g")
    assert h.hold(victim, "pod")
    remote = Allocation("remote", "home", 500, 1024,
                        (Slice("GPU-g-0", 0, 80 * GIB, 100, "main"),), False, "g")
    assert not h.hold(remote, "ledger")  # the victim's slice is in its way: parked
    h.unhold("victim", "pod")  # the victim leaves (its home is "other", its GPUs g's)
    assert "remote" in state.allocations and not h.waiting and not h.waiting_on
