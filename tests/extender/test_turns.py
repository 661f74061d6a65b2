"""Turns and batches: writers of one record one at a time, and the items that queued
while a write was on its way written together by whoever gets the turn next."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from waiting import wait_for

from gpupool.extender.state.turns import Batches, BatchFailed, Turns


def test_items_that_queue_during_a_write_go_together_in_the_next() -> None:
    batches: Batches[int, int] = Batches()
    writing, release = threading.Event(), threading.Event()
    writes: list[list[int]] = []
    results: dict[int, int] = {}

    def write(items: Sequence[int]) -> list[int]:
        writes.append(list(items))
        if len(writes) == 1:  # the first write waits until the others have queued
            writing.set()
            release.wait(10)
        return [i * 10 for i in items]

    def submit(k: int) -> None:
        results[k] = batches.submit("n1", k, write)

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    assert writing.wait(10)
    others = [threading.Thread(target=submit, args=(k,)) for k in range(1, 5)]
    for t in others:
        t.start()
    assert wait_for(lambda: batches.queued("n1") == 4)
    release.set()
    for t in (first, *others):
        t.join(10)
    assert writes[0] == [0] and sorted(writes[1]) == [1, 2, 3, 4] and len(writes) == 2
    assert results == {k: k * 10 for k in range(5)}
    assert batches.turns.held() == 0 and batches.queued("n1") == 0


def test_records_of_different_names_never_wait_for_each_other() -> None:
    turns = Turns()
    done = threading.Event()

    def other() -> None:
        with turns.of("n2"):
            done.set()

    with turns.of("n1"):
        threading.Thread(target=other).start()
        assert done.wait(10)  # n2's turn while n1's is held
    assert wait_for(lambda: turns.held() == 0)


def test_a_failed_write_fails_every_item_it_carried() -> None:
    batches: Batches[int, int] = Batches()

    def write(items: Sequence[int]) -> list[int]:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):  # the writer gets the error itself
        batches.submit("n1", 1, write)
    assert batches.turns.held() == 0


def test_an_item_written_by_another_gets_a_batch_failure() -> None:
    batches: Batches[int, int] = Batches()
    writing, release = threading.Event(), threading.Event()
    seen: list[BaseException] = []

    def write(items: Sequence[int]) -> list[int]:
        if items == [0]:
            writing.set()
            release.wait(10)
            return [0]
        raise RuntimeError("boom")

    def submit(k: int) -> None:
        try:
            batches.submit("n1", k, write)
        except Exception as exc:
            seen.append(exc)

    threads = [threading.Thread(target=submit, args=(0,))]
    threads[0].start()
    assert writing.wait(10)
    threads += [threading.Thread(target=submit, args=(k,)) for k in (1, 2)]
    for t in threads[1:]:
        t.start()
    assert wait_for(lambda: batches.queued("n1") == 2)
    release.set()
    for t in threads:
        t.join(10)
    assert sorted(type(e).__name__ for e in seen) == ["BatchFailed", "RuntimeError"]
    assert any(isinstance(e, BatchFailed) and "boom" in str(e) for e in seen)
