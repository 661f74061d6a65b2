"""Errors of Kubernetes API calls (I/O), on top of ``gpupool.core.errors.GpupoolError``.

    GpupoolError
    ├── InvalidInput
    │   └── KubeconfigError  a Kubernetes configuration that cannot be used (``kubeconfig``)
    └── KubeError            an API call failed (``code``: HTTP status, 0 = no answer)
        ├── NotFound         404: the object does not exist
        ├── Conflict         409: a resourceVersion precondition failed, or the pod is bound
        │   └── AlreadyExists  409 on create: the name is taken
        └── Gone             410: a watch's resourceVersion is too old; list again
"""

from __future__ import annotations

from gpupool.core.errors import GpupoolError, InvalidInput


class KubeconfigError(InvalidInput):
    """A Kubernetes configuration that cannot be used; the message names the file."""


class KubeError(GpupoolError):
    """An API call that failed; ``code`` is the HTTP status (0 when nothing answered)."""

    def __init__(self, message: str, code: int = 0, reason: str = ""):
        super().__init__(message)
        self.code = code
        self.reason = reason


class NotFound(KubeError):
    """The object does not exist (HTTP 404)."""


class Conflict(KubeError):
    """Someone else changed the object first (HTTP 409); read it again and retry."""


class AlreadyExists(Conflict):
    """Create of a name that is taken (HTTP 409, reason AlreadyExists)."""


class Gone(KubeError):
    """The watch's resourceVersion is too old (HTTP 410); list again."""


def from_status(code: int, reason: str, message: str) -> KubeError:
    """The exception for an API ``Status`` answer."""
    if code == 404:
        return NotFound(message, code, reason)
    if code == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(message, code, reason)
    if code == 410:
        return Gone(message, code, reason)
    return KubeError(message, code, reason)
