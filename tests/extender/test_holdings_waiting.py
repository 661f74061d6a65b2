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


def remote(key: str, gpu_node: str, home: str = "h") -> Allocation:
    return Allocation(key, home, 100, 256,
                      (Slice(f"GPU-{gpu_node}-0", 0, 80 * GIB, 100, "main"),), False, gpu_node)


def test_the_pods_own_record_is_not_lost_when_a_stale_ledger_entry_is_retried() -> None:
    state = ClusterState([Node("h", 1000, 4096), Node("o", 1000, 4096),
                          Node("g1", 8000, 65536, (Gpu("GPU-g1-0", 0, "A100", 80 * GIB),)),
                          Node("g2", 8000, 65536, (Gpu("GPU-g2-0", 0, "A100", 80 * GIB),))])
    h = Holdings(state, Catalogue())
    assert h.hold(remote("a", "g1", "o"), "pod")  # g1 full
    assert h.hold(remote("b", "g2", "o"), "pod")  # g2 full
    assert not h.hold(remote("x", "g1"), "ledger")  # x's ledger entry (stale): parked
    assert not h.hold(remote("x", "g2"), "pod")  # x's own record: parked too
    h.unhold("a", "pod")  # g1 frees first
    h.unhold("b", "pod")  # then g2
    # the pod's own record wins over a ledger entry: x is held on g2 in the end
    assert state.allocations["x"].gpu_node == "g2"
    assert not h.waiting and not h.waiting_on


def test_a_ledger_entry_parked_after_the_pods_own_record_does_not_replace_it() -> None:
    state = ClusterState([Node("h", 1000, 4096), Node("o", 1000, 4096),
                          Node("g1", 8000, 65536, (Gpu("GPU-g1-0", 0, "A100", 80 * GIB),)),
                          Node("g2", 8000, 65536, (Gpu("GPU-g2-0", 0, "A100", 80 * GIB),))])
    h = Holdings(state, Catalogue())
    assert h.hold(remote("a", "g1", "o"), "pod")
    assert h.hold(remote("b", "g2", "o"), "pod")
    assert not h.hold(remote("x", "g2"), "pod")  # its own record first
    assert not h.hold(remote("x", "g1"), "ledger")  # then a stale ledger entry
    h.unhold("a", "pod")
    h.unhold("b", "pod")
    assert state.allocations["x"].gpu_node == "g2" and not h.waiting
