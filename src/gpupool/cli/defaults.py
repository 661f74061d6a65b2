"""Values of gpupool's modules that the commands' flags show: defaults and choices.

Restated here so that building a command's parser imports none of the modules they come
from: each of those brings numpy, the Kubernetes client, gRPC or cryptography with it,
and ``gpupool extender --port 0`` or ``kubectl gpupool --help`` should not wait for
them. Where a value comes from is named beside it; tests/cli/test_startup.py checks
every value here against its source, so a change there fails the test until it is made
here too.
"""

from __future__ import annotations

from pathlib import Path

POLICY_NAMES = ("best-fit", "clustering", "dot-product", "fgd", "fgd-balance", "packing",
                "random", "spread")
"""``sorted(gpupool.core.policies.POLICIES)``."""
DEFAULT_POLICY = "fgd-balance"  # gpupool.core.policies.DEFAULT_POLICY
ZONE_LABEL = "topology.kubernetes.io/zone"  # gpupool.core.serving.ZONE_LABEL

# the extender's
SCHEDULER_NAME = "gpupool-scheduler"  # gpupool.extender.bind.gate.DEFAULT_SCHEDULER
GANG_TIMEOUT_S = 300.0  # gpupool.extender.bind.gangclaims.GANG_TIMEOUT_S
SERVING_SECRET = "gpupool-extender-tls"  # gpupool.extender.edge.tls.SERVING_SECRET
CLIENT_SECRET = "gpupool-scheduler-client"  # gpupool.extender.edge.tls.CLIENT_SECRET
SERVICE = "gpupool-extender"  # gpupool.extender.edge.tls.SERVICE
CLIENT_SCHEDULER = "system:gpupool:kube-scheduler"  # gpupool.security.certs.CLIENT_SCHEDULER

# the node agent's
STRATEGIES = ("volume-mounts", "cdi", "envvar")
"""The values of ``gpupool.nodeagent.exposure.Strategy``, in its order."""
DEFAULT_STRATEGY = "volume-mounts"  # gpupool.nodeagent.exposure.Strategy.VOLUME_MOUNTS
DEFAULT_CDI_KIND = "nvidia.com/gpu"  # gpupool.nodeagent.exposure.DEFAULT_CDI_KIND
DEFAULT_CDI_DIR = Path("/var/run/cdi")  # gpupool.nodeagent.dra.cdi.DEFAULT_CDI_DIR
OVERUSE_ACTIONS = ("warn", "isolate", "evict", "pause")
"""The values of ``gpupool.nodeagent.actions.OveruseAction``, in its order."""
DEFAULT_OVERUSE_ACTION = "warn"  # gpupool.nodeagent.actions.OveruseAction.WARN
ISOLATION_LABEL = "gpupool.io/isolation-provider"
"""``gpupool.nodeagent.isolation.provider.NODE_LABEL``."""
HAMI_CORE_LIBRARY = "/usr/local/vgpu/libvgpu.so"
"""``gpupool.nodeagent.isolation.hamicore.DEFAULT_LIBRARY``."""
COMPUTE_MODE_SOCKET = Path("/run/gpupool/mps-helper/compute-mode.sock")
"""``gpupool.nodeagent.isolation.computemode.SOCKET``."""
