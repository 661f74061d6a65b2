"""The shipped KubeSchedulerConfiguration works for every ResourceClass with no edits.

kube-scheduler's NodeResourcesFit filter refuses a pod whose extended resource no node
advertises (``Insufficient class.gpupool.io/<class>``) unless the resource is ignored.
The configuration ignores the whole ``class.gpupool.io`` group, checked here the way
kube-scheduler v1 reads it:

* ``pluginConfig[].args`` of ``NodeResourcesFit`` decode as ``NodeResourcesFitArgs``
  (``apiVersion``/``kind``, when given, must name exactly that);
* ``ignoredResourceGroups`` entries may not contain ``/`` and must be qualified names;
* ``ignoredResources`` would be overwritten by the extenders' ``ignoredByScheduler``
  names, so nothing may rely on it;
* a missing ``scoringStrategy`` is defaulted (LeastAllocated over cpu and memory, weight
  1), so setting the arguments keeps the plugin's default scoring.
"""

from __future__ import annotations

import re
from typing import Any

from gpupool.contract import names
from gpupool.contract.podspec_request import pod_request

from .test_deploy import scheduler_config

QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
FIT_ARGS_KEYS = {"apiVersion", "kind", "ignoredResources", "ignoredResourceGroups",
                 "scoringStrategy"}


def fit_args() -> dict[str, Any]:
    (profile,) = scheduler_config()["profiles"]
    configs = [c for c in profile.get("pluginConfig", []) if c["name"] == "NodeResourcesFit"]
    assert len(configs) == 1, "one NodeResourcesFit pluginConfig in the profile"
    args: dict[str, Any] = configs[0]["args"]
    return args


def test_the_profile_ignores_the_whole_class_resource_group() -> None:
    args = fit_args()
    group = names.CLASS_RESOURCE_PREFIX.rstrip("/")
    assert group in args["ignoredResourceGroups"]


def test_the_fit_arguments_parse_as_kube_scheduler_v1_reads_them() -> None:
    args = fit_args()
    assert set(args) <= FIT_ARGS_KEYS, f"unknown keys: {set(args) - FIT_ARGS_KEYS}"
    assert args.get("apiVersion", "kubescheduler.config.k8s.io/v1") == \
        "kubescheduler.config.k8s.io/v1"
    assert args.get("kind", "NodeResourcesFitArgs") == "NodeResourcesFitArgs"
    for group in args["ignoredResourceGroups"]:
        assert "/" not in group and len(group) <= 63 and QUALIFIED_NAME.fullmatch(group), group


def test_the_fit_arguments_keep_the_default_scoring_and_rely_on_no_ignored_resources() -> None:
    args = fit_args()
    assert "scoringStrategy" not in args  # defaulted to LeastAllocated (cpu, memory)
    assert "ignoredResources" not in args  # replaced by the extenders' ignoredByScheduler


def test_a_pod_of_a_class_created_after_the_scheduler_started_is_left_to_gpupool() -> None:
    """A pod asking a brand-new class: the class resource is in the ignored group, and the
    pod reaches the extender through gpupool.io/gpu (which the webhook adds), a managed
    resource."""
    args = fit_args()
    ext = scheduler_config()["extenders"][0]  # the main entry (the second: DRA scoring)
    managed = {m["name"] for m in ext["managedResources"]}
    resources = {"class.gpupool.io/big-mem": "1", names.RESOURCE_GPU: "1"}
    pod = {"metadata": {"name": "p", "namespace": "t"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": resources,
                                                                "requests": resources}}]}}
    assert pod_request(pod).gpu_class == "big-mem"
    for resource in resources:
        group = resource.split("/", 1)[0]
        ignored = group in args["ignoredResourceGroups"] or any(
            m["name"] == resource and m["ignoredByScheduler"] for m in ext["managedResources"])
        advertised = resource == names.RESOURCE_GPU  # by the node agent, through kubelet
        assert ignored or advertised, f"kube-scheduler would look for {resource} on nodes"
    assert managed & set(resources), "the pod would not reach the extender"
