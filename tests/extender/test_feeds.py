"""``feeds.long_lived``: the collector paused during the rebuild, its result frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpupool.extender.state.feeds import long_lived


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector on and nothing frozen before; the same state after, whatever the
    test did (a frozen heap would outlive the test)."""
    was_enabled = gc.isenabled()
    gc.enable()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if not was_enabled:
            gc.disable()


def test_the_block_runs_without_the_collector_and_what_it_built_is_frozen(collector: None
                                                                          ) -> None:
    with long_lived():
        assert not gc.isenabled()
        kept = [[row] for row in range(5000)]  # tracked containers, as a rebuild makes
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)
    collected = {id(o) for o in gc.get_objects()}  # the generations a collection walks
    assert not any(id(k) in collected for k in kept)


def test_the_collector_is_enabled_again_when_the_block_raises(collector: None) -> None:
    with pytest.raises(TimeoutError, match="could not list pods"), long_lived():
        raise TimeoutError("could not list pods within 120s")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(collector: None) -> None:
    gc.disable()
    with long_lived():
        assert not gc.isenabled()
    assert not gc.isenabled()
