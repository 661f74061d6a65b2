"""The extender's request framing: ``gpupool.http.framing`` (shared with the webhook)."""

from gpupool.http.framing import END, Framing

__all__ = ["END", "Framing"]
