"""Node-scoped evictions: a node agent may evict only pods bound to its own node.

The node agent evicts over-users through the Eviction API (``pods/eviction``). The
Eviction names only the pod, so CEL cannot check the pod's node; the webhook looks the
pod up (``PodNode``, injected: the rule stays free of I/O) and compares its
``spec.nodeName`` with the node in the caller's pod-bound token
(``authentication.kubernetes.io/node-name``). A pod that cannot be read is refused
(fail closed); a pod that does not exist is left to the API server (404).
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core.errors import GpupoolError
from gpupool.webhook.review import Request

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"

PodNode = Callable[[str, str], "str | None"]
"""``(namespace, name) -> spec.nodeName`` ("" when unbound, None when there is no such
pod); raises ``GpupoolError`` when the pod cannot be read."""


def caller_node(request: Request) -> str:
    values = request.extra.get(NODE_NAME_EXTRA, ())
    return values[0] if len(values) == 1 else ""


def check_eviction(request: Request, node_scoped: frozenset[str], pod_node: PodNode | None
                   ) -> str:
    """Why this eviction is refused ("" when it is not)."""
    if request.username not in node_scoped:
        return ""
    who = f"pod {request.namespace}/{request.name}"
    node = caller_node(request)
    if not node:
        return (f"{who}: {request.username} must call with a pod-bound service-account token "
                "that names its node to evict")
    if pod_node is None:
        return f"{who}: the webhook cannot look pods up, so node agents may not evict"
    try:
        actual = pod_node(request.namespace, request.name)
    except GpupoolError as exc:
        return f"{who}: cannot check the pod's node ({exc}); eviction refused"
    if actual is None or actual == node:
        return ""
    where = f"bound to node {actual}" if actual else "not bound to a node"
    return f"the node agent of node {node} may not evict {who}, which is {where}"
