"""The exception tree of gpupool (exceptions are for bugs, bad input and I/O).

    GpupoolError
    ├── InvalidInput          bad user or wire input (quantity, selector, request, trace row)
    │   └── QuantityError     a Kubernetes quantity that does not parse
    ├── OverCommit            a reservation that would over-commit a GPU, CPU or memory
    └── UnknownName           an unknown policy, node, GPU or allocation name

Results of normal decisions (a pod that does not fit) are values, not exceptions:
see ``gpupool.core.reasons``.
"""


class GpupoolError(Exception):
    """Base of every error gpupool raises on purpose."""


class InvalidInput(GpupoolError, ValueError):
    """Input that cannot be accepted; the message says what and why."""


class QuantityError(InvalidInput):
    """A Kubernetes quantity string that does not parse."""


class OverCommit(GpupoolError):
    """A reservation that would use more than is free; nothing was changed."""


class UnknownName(GpupoolError, KeyError):
    """A name (policy, node, GPU, allocation) that is not known."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown name"
