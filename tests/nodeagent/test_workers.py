"""The node agents' threads (device-plugin and DRA mode): periodic work that survives a
failed round, one stop for all, and a thread that will not stop named rather than waited
for."""

from __future__ import annotations

import logging
import threading

import pytest

from gpupool.core.errors import GpupoolError
from gpupool.nodeagent.workers import Workers

from .builders import wait_for


def test_periodic_work_goes_on_after_a_failed_round_and_says_why(
        caplog: pytest.LogCaptureFixture) -> None:
    rounds: list[int] = []

    def work() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise GpupoolError("the API server is away")
        if len(rounds) == 2:
            raise KeyError("a bug")

    workers = Workers()
    with caplog.at_level(logging.WARNING, logger="gpupool.nodeagent.workers"):
        workers.every(0.01, work, "sampler", "usage sample")
        wait_for(lambda: len(rounds) >= 4)
        assert workers.alive("sampler")
        workers.stop()
    assert not workers.alive("sampler")
    text = caplog.text
    assert "usage sample failed (next one in 0 s): the API server is away" in text
    assert "usage sample failed unexpectedly" in text and "KeyError: 'a bug'" in text


def test_stop_wakes_the_events_threads_wait_on_and_joins_them() -> None:
    workers = Workers()
    changed = threading.Event()
    ended: list[str] = []

    def heartbeat() -> None:
        while not workers.stopping.is_set():
            changed.wait(3600)  # only a change (or stop) wakes it
            changed.clear()
        ended.append("heartbeat")

    workers.spawn(heartbeat, "inventory")
    workers.stop(changed)
    assert ended == ["heartbeat"] and not workers.alive("inventory")


def test_a_thread_that_does_not_stop_is_named_and_not_waited_for(
        caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    workers = Workers(join_s=0.05)
    workers.spawn(lambda: release.wait(60) and None, "stuck")
    with caplog.at_level(logging.WARNING, logger="gpupool.nodeagent.workers"):
        workers.stop()
    assert "threads still running after 0.05 s: stuck" in caplog.text
    release.set()
    wait_for(lambda: not workers.alive("stuck"))
