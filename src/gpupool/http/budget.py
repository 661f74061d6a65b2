"""The bytes of request bodies a server holds at once, over all its connections.

A server reserves a body's bytes (its declared length, else the largest body it accepts)
before reading it and releases them once the request is answered; a body that would take
the total past ``cap_bytes`` is refused unread, so concurrent large requests cannot add
up past the process's memory limit. Each server words the refusal in its own protocol
(the extender: an ``Error`` in its verb's answer; the webhook: 429 with Retry-After).
The caller runs on one event loop: no locking."""

from __future__ import annotations


class BodyBudget:
    """Bytes of bodies being read or decided now, at most ``cap_bytes``."""

    def __init__(self, cap_bytes: int):
        self.cap_bytes = cap_bytes
        self.reading = 0

    def reserve(self, size: int) -> bool:
        """Hold ``size`` bytes; False (nothing held) when that would pass the cap."""
        if self.reading + size > self.cap_bytes:
            return False
        self.reading += size
        return True

    def release(self, size: int) -> None:
        self.reading -= size
