"""The fields of a Kubernetes v1 Pod, as strict YAML shapes (``gpupool.contract.yamlcheck``).

The field names are Kubernetes' own (core/v1 ``Pod``, ``ObjectMeta``, ``PodSpec``,
``Container``, ``ResourceRequirements``, Kubernetes 1.37), so a manifest the API
server accepts is accepted here, and a misspelt field on the paths gpupool reads is
reported, as ``kubectl --validate=strict`` would. Values gpupool does not read are
not looked into. Inside a container's ``resources``, names in gpupool's own
``gpupool.io/`` namespace must be the resources gpupool serves
(``gpupool.io/gpu-memroy`` is a typo, not a resource); on the pod's labels and
annotations a ``gpupool.io/`` key that closely resembles one a user sets is taken
for a typo of it.
"""

from __future__ import annotations

from gpupool.contract import names
from gpupool.contract.yamlcheck import QUANTITY, TEXT, Map, Seq, Shape, strings

OWN_NAMES = tuple(sorted(v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)
                         and v.startswith(f"{names.GROUP}/")))
"""Every ``gpupool.io/`` label, annotation and resource name of the contract."""
OBJECT_META = Map({
    **strings("creationTimestamp", "deletionGracePeriodSeconds", "deletionTimestamp",
              "finalizers", "generateName", "generation", "managedFields", "name", "namespace",
              "ownerReferences", "resourceVersion", "selfLink", "uid"),
    "labels": Map(dict.fromkeys(OWN_NAMES, TEXT), others=TEXT, typos_of=(names.LABEL_GROUP,)),
    "annotations": Map(dict.fromkeys(OWN_NAMES, TEXT), others=TEXT,
                       typos_of=(names.ANNOTATION_MODE, names.ANNOTATION_AFFINITY,
                                 names.ANNOTATION_PLACEMENT)),
})
AMOUNTS = Map({names.RESOURCE_GPU: QUANTITY, names.RESOURCE_MEMORY: QUANTITY,
               names.RESOURCE_CORE: QUANTITY}, others=QUANTITY, closed=(f"{names.GROUP}/",))
"""``limits`` / ``requests``: any resource name, but only gpupool's in its namespace."""
RESOURCES = Map({"claims": Seq(Map(strings("name", "request"))), "limits": AMOUNTS,
                 "requests": AMOUNTS})
CONTAINER_FIELDS = (
    "args", "command", "env", "envFrom", "image", "imagePullPolicy", "lifecycle",
    "livenessProbe", "name", "ports", "readinessProbe", "resizePolicy", "restartPolicy",
    "restartPolicyRules", "securityContext", "startupProbe", "stdin", "stdinOnce",
    "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices",
    "volumeMounts", "workingDir")
CONTAINER = Map({**strings(*CONTAINER_FIELDS), "resources": RESOURCES})
POD_SPEC_FIELDS = (
    "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "dnsConfig",
    "dnsPolicy", "enableServiceLinks", "ephemeralContainers", "evictionResponders",
    "hostAliases", "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname",
    "hostnameOverride", "imagePullSecrets", "nodeName", "nodeSelector", "os", "overhead",
    "preemptionPolicy", "priority", "priorityClassName", "readinessGates", "resourceClaims",
    "resources", "restartPolicy", "runtimeClassName", "schedulerName", "schedulingGates",
    "schedulingGroup", "securityContext", "serviceAccount", "serviceAccountName",
    "setHostnameAsFQDN", "shareProcessNamespace", "subdomain", "terminationGracePeriodSeconds",
    "tolerations", "topologySpreadConstraints", "volumes")
POD_SPEC = Map({**strings(*POD_SPEC_FIELDS), "containers": Seq(CONTAINER),
                "initContainers": Seq(CONTAINER)}, required=frozenset({"containers"}))
POD: Shape = Map({**strings("apiVersion", "kind", "status"), "metadata": OBJECT_META,
                  "spec": POD_SPEC})
"""A v1 Pod manifest."""
