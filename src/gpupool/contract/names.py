"""Resource names, labels and annotation keys users and components type (stable)."""

GROUP = "gpupool.io"
API_VERSION = "gpupool.io/v1alpha1"

# pod resources (container limits)
RESOURCE_GPU = "gpupool.io/gpu"
RESOURCE_MEMORY = "gpupool.io/gpu-memory"  # MiB per GPU
RESOURCE_CORE = "gpupool.io/gpu-core"  # percent of one GPU per GPU
CLASS_RESOURCE_PREFIX = "class.gpupool.io/"
RESOURCE_REMOTE_GPU = "gpupool.io/remote-gpu"  # GPUs of a remote-required pod (docs/remote.md)

# set by users
LABEL_GROUP = "gpupool.io/group"
ANNOTATION_MODE = "gpupool.io/mode"  # exclusive | shared
ANNOTATION_AFFINITY = "gpupool.io/affinity"  # pod | least-loaded
ANNOTATION_PLACEMENT = "gpupool.io/placement"  # local | remote-allowed | remote-required
ANNOTATION_HEALING = "gpupool.io/healing"  # "off": the controller never evicts it to heal it
ANNOTATION_MEMORY_LIMIT = "gpupool.io/gpu-memory-limit"  # burst limit, MiB per GPU
ANNOTATION_CORE_LIMIT = "gpupool.io/gpu-core-limit"  # burst limit, percent of one GPU

# gangs (docs/gangs.md): Kubernetes' PodGroup API, or gpupool's labels on older clusters
PODGROUP_GROUP = "scheduling.k8s.io"
PODGROUP_VERSION = "v1alpha2"
LABEL_GANG = "gpupool.io/gang"  # a pod's gang (its name) on clusters without PodGroups
ANNOTATION_GANG_MIN_COUNT = "gpupool.io/gang-min-count"  # members needed (labelled gangs)
ANNOTATION_GANG_TOGETHER = "gpupool.io/gang-together"  # node | domain (a gang's members)
ANNOTATION_GANG_DOMAIN = "gpupool.io/gang-domain-label"  # the node label of "domain"

# written by gpupool (the durable record of a decision)
ANNOTATION_NODE = "gpupool.io/node"
ANNOTATION_ALLOCATION = "gpupool.io/allocation"
ANNOTATION_BIND_TIME = "gpupool.io/bind-time"
ANNOTATION_PHASE = "gpupool.io/phase"
ANNOTATION_REASON = "gpupool.io/reason"
ANNOTATION_SIGNATURE = "gpupool.io/signature"  # the extender's signature of the decision

ANNOTATION_RESOURCE_GROUP = "gpupool.io/resource-group"  # the group the pod was charged to
ANNOTATION_DEVICES = "gpupool.io/devices"  # node agent's claim: {container: {logical ID: uuid}}

# remote GPU slices (docs/remote.md)
ANNOTATION_SLICE = "gpupool.io/slice"  # the admission webhook's name of a pod's remote slice
ANNOTATION_SLICE_STATUS = "gpupool.io/slice-status"  # the controller's: its server's state

# GPUDevice status.health (the node agent writes them, the extender and controller read
# them; the same words as the kubelet device plugin API's device health)
DEVICE_HEALTHY = "Healthy"
DEVICE_UNHEALTHY = "Unhealthy"
DEVICE_ISOLATED = "Isolated"  # GPUDevice status.isolation.state: takes no new placements

# labels gpupool puts on GPUDevice objects (and GPU label facts selectors see)
LABEL_NODE = "gpupool.io/node"
LABEL_MODEL = "gpupool.io/model"
LABEL_POOL = "gpupool.io/pool"  # (spec.labels) the pool a GPU is counted in, by default

PHASE_ALLOCATING = "allocating"
PHASE_ALLOCATED = "allocated"
PHASE_FAILED = "failed"
PHASES = (PHASE_ALLOCATING, PHASE_ALLOCATED, PHASE_FAILED)

POD_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""Kubernetes pod phases after which a pod holds nothing."""
