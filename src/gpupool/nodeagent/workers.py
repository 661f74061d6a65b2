"""The background threads of a node agent (device-plugin or DRA mode): started by name, told
to stop through one event, and joined on stop.

``Workers.every`` is the loop both agents' periodic work runs in: one round every
``period_s``, a round that fails is logged (a ``GpupoolError`` as a warning, anything else
with its traceback, since a bug must not end the work for the agent's lifetime) and the
next round comes as usual. A thread still running after ``join_s`` on stop is named in a
warning rather than waited for: every thread is a daemon, and the process is ending.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpupool.core.errors import GpupoolError

log = logging.getLogger(__name__)


class Workers:
    """One agent's threads and the event that tells them to stop."""

    def __init__(self, join_s: float = 3.0):
        self.join_s = join_s
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def spawn(self, target: Callable[[], None], name: str) -> None:
        """Run ``target`` in a daemon thread called ``name``."""
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def every(self, period_s: float, work: Callable[[], None], name: str, what: str) -> None:
        """Run ``work`` every ``period_s`` (the first time after one period) until stopped;
        ``what`` names it in the log when a round fails."""
        def loop() -> None:
            while not self.stopping.wait(period_s):
                try:
                    work()
                except GpupoolError as exc:
                    log.warning("%s failed (next one in %.0f s): %s", what, period_s, exc)
                except Exception:  # a bug must not end the work for the agent's lifetime
                    log.exception("%s failed unexpectedly (next one in %.0f s)", what,
                                  period_s)
        self.spawn(loop, name)

    def alive(self, name: str) -> bool:
        """Whether a thread called ``name`` is running."""
        return any(t.name == name and t.is_alive() for t in self._threads)

    def signal(self, *wake: threading.Event) -> None:
        """Tell every thread to stop, and set ``wake`` (events threads may be waiting on)."""
        self.stopping.set()
        for event in wake:
            event.set()

    def join(self) -> None:
        """Wait up to ``join_s`` for each thread; name those still running."""
        for t in self._threads:
            t.join(timeout=self.join_s)
        left = [t.name for t in self._threads if t.is_alive()]
        if left:
            log.warning("threads still running after %g s: %s", self.join_s, ", ".join(left))

    def stop(self, *wake: threading.Event) -> None:
        """``signal`` then ``join``."""
        self.signal(*wake)
        self.join()
