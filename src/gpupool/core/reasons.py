"""Why a pod does not fit a node, as values that render to actionable sentences.

``for_scheduler`` is the one rule for text that goes to kube-scheduler (filter reasons,
an extender's ``Error``): no ``%`` sign, written as a word instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Check(Enum):
    """The fit checks, in the order they are applied."""

    QUOTA = "quota"
    GROUP = "group"
    MODEL = "gpu-model"
    CLASS = "class"
    GPU_COUNT = "gpu-count"
    GPU_SIZE = "gpu-size"
    CPU = "cpu"
    MEMORY = "memory"
    GPU_HEALTH = "gpu-health"
    GPU_FREE = "gpu-free"
    NODE_MODE = "node-mode"  # the node serves its GPUs another way (checked before GROUP)
    REMOTE = "remote-slice"  # no GPU here, nor elsewhere for a remote slice (core.serving)
    MIG = "mig-profile"  # no MIG device of the asked profile here (core.mig)
    GANG = "gang"  # a gang member: its slices are held on another node, or its gang waits


@dataclass(frozen=True, slots=True)
class Reason:
    """One failed check on one node.

    ``permanent`` separates "can never fit here" (capacity, model, class, group)
    from "does not fit now" (something else holds the room), as kube-scheduler's
    Unschedulable vs UnschedulableAndUnresolvable.
    """

    node: str
    check: Check
    message: str
    permanent: bool
    summary: str = ""
    """The message without the figures only this node has ("": it has none)."""

    def sentence(self) -> str:
        return f"node {self.node}: {self.message}"

    def common(self) -> str:
        """The message as every node in the same situation gives it: no node name, none of
        the node's own free amounts. kube-scheduler counts identical reasons ("0/5000
        nodes are available: 1211 <reason>, ...") and cuts that message at 1,024 bytes,
        so reasons that differ from node to node would show a handful of nodes and no
        counts."""
        return self.summary or self.message


_PERCENT = re.compile(r"[ \t]*%+[ \t]*")


def for_scheduler(text: str) -> str:
    """``text`` as kube-scheduler can show it: every ``%`` written as the word "percent".

    kube-scheduler makes the pod's FailedScheduling Event with
    ``Eventf(pod, nil, Warning, "FailedScheduling", "Scheduling", msg)``, and the events
    recorder calls ``fmt.Sprintf(msg)``: the counted reasons (or an extender's ``Error``)
    are a Go *format*, with no arguments. There every ``%`` starts a verb, so "10 % core"
    reaches the user as "10 %!c(MISSING)ore" and a final "%" as "%!(NOVERB)". The same
    text also goes, unformatted, into the pod's PodScheduled condition, so doubling the
    sign ("%%", right in the Event) would show "%%" there; a word reads the same in both.
    """
    if "%" not in text:
        return text

    def word(m: re.Match[str]) -> str:
        return (" " if m.start() else "") + "percent" + (" " if m.end() < len(text) else "")
    return _PERCENT.sub(word, text)
