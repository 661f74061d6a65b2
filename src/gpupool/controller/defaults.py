"""Default resource classes: one per GPU model the cluster publishes.

A GPU model ``A100-SXM4-80GB`` gets the class ``a100-sxm4-80gb`` selecting
``gpupool.io/model In [A100-SXM4-80GB]``, so a pod can ask for
``class.gpupool.io/a100-sxm4-80gb: 1`` without anyone writing a class first.
Models whose names fold to the same class name share the class (the selector
lists them all).

The controller marks the classes it makes with the label
``app.kubernetes.io/managed-by: gpupool-controller`` and touches only those:
a class a user created with the same name stays as it is (the model then has
no default class, and the controller says so). A user takes a default class
over by removing the label; the controller then leaves it alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.contract import names
from gpupool.core.groupplan import slug

MANAGED_BY = "app.kubernetes.io/managed-by"
CONTROLLER = "gpupool-controller"
ANNOTATION_MODELS = "gpupool.io/default-for-models"
"""On a default class: the GPU models it stands for, comma-separated."""
MODEL_LABEL = names.LABEL_MODEL
"""The GPU label selectors read for the model (``gpupool.core.model.Gpu.label_map``)."""


def class_name_for(model: str) -> str:
    """The default class name of a GPU model: a lower-case DNS label (``A100 PCIe`` ->
    ``a100-pcie``)."""
    return slug(model)


def is_owned(obj: Mapping[str, Any]) -> bool:
    """Did the controller make this object (and may it change or delete it)?"""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return isinstance(labels, Mapping) and labels.get(MANAGED_BY) == CONTROLLER


def default_classes(models: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The default ResourceClass objects for ``models``, by class name."""
    by_name: dict[str, set[str]] = {}
    for model in models:
        by_name.setdefault(class_name_for(model), set()).add(model)
    return {name: default_class(name, sorted(group)) for name, group in sorted(by_name.items())}


def default_class(name: str, models: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ResourceClass",
        "metadata": {"name": name, "labels": {MANAGED_BY: CONTROLLER},
                     "annotations": {ANNOTATION_MODELS: ",".join(models)}},
        "spec": {"selector": {"matchExpressions": [
            {"key": MODEL_LABEL, "operator": "In", "values": models}]}},
    }
