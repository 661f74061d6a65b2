"""The FAKE API server's own rules: which watches a write wakes, and the event lines it
renders once for every watcher."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from gpupool_testing.fake_store import Listener, Store, copied, event_line


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


class RecordingLoop:
    """Stands in for an event loop: records what a write asks it to wake."""

    def __init__(self) -> None:
        self.woken: list[asyncio.Event] = []

    def call_soon_threadsafe(self, fn: Any) -> None:
        self.woken.append(fn.__self__)


def test_a_write_wakes_only_the_watches_of_its_kind() -> None:
    store = Store()
    loop = RecordingLoop()
    pods, nodes = asyncio.Event(), asyncio.Event()
    store.listeners += [Listener(loop, pods, "pods"),  # type: ignore[arg-type]
                        Listener(loop, nodes, "nodes")]  # type: ignore[arg-type]
    store.create("nodes", node("n1"))
    assert loop.woken == [nodes]


def test_an_event_line_is_the_object_as_written_then_and_later_writes_leave_it() -> None:
    store = Store()
    store.create("nodes", node("n1"))
    store.update("nodes", "n1", None, {"metadata": {"labels": {"zone": "a"}}})
    (_, kind, obj, line), = store.events_after(1, "nodes")
    assert kind == "MODIFIED" and msgspec.json.decode(line) == {"type": kind, "object": obj}
    assert line.endswith(b"\n") and obj["metadata"]["labels"]["zone"] == "a"
    store.update("nodes", "n1", None, {"metadata": {"labels": {"zone": "b"}}})
    assert obj["metadata"]["labels"]["zone"] == "a"  # the history kept its own copy
    assert event_line("ADDED", {"a": [1, "x"]}) == b'{"type":"ADDED","object":{"a":[1,"x"]}}\n'


def test_copied_data_shares_nothing_with_the_original() -> None:
    original = {"a": {"b": [1, {"c": "d"}]}, "e": None}
    twin = copied(original)
    assert twin == original
    twin["a"]["b"][1]["c"] = "changed"
    assert original["a"]["b"][1]["c"] == "d"
