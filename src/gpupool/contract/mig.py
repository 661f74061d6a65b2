"""MIG as gpupool's components exchange it (``core.mig`` holds the rules).

* **Pod resources**: ``mig.gpupool.io/<profile>: N`` asks N MIG devices of that
  profile (``mig.gpupool.io/1g.10gb: 1``), each whole. kube-scheduler's
  NodeResourcesFit ignores the ``mig.gpupool.io`` resource group (as it ignores
  ``class.gpupool.io``), so no profile needs an entry in its configuration; kubelet
  counts the ``gpupool.io/gpu`` the admission webhook adds (N), and the node agent
  serves the decided MIG devices.
* **GPUDevice ``spec.mig``** (``mig_spec`` / ``read_mig``): ``{mode: Enabled}`` on a GPU
  in MIG mode (``Gpu.mig`` a ``MigMode``); on a MIG device, which has a GPUDevice of
  its own named after its ``MIG-...`` uuid, ``{parent, profile, placement: {start,
  size}, slices, gpuInstance, computeInstance}`` (``MigDevice``).
* **MIG on demand** (``docs/design/mig.md``): the controller asks for a layout with the
  annotation ``gpupool.io/mig-layout`` on the GPU's GPUDevice (``1g.10gb@0,3g.40gb@4``,
  ``core.mig.describe_layout``'s form) and ``gpupool.io/mig-layout-reason`` (why); the
  node agent makes it, or says why not, in ``status.mig`` (``layout`` now, ``requested``,
  ``state`` Applied | Refused | Failed, ``message``, ``changedTime``) and an Event.

Bad input raises ``InvalidInput`` naming the object and the field. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.core.mig import MigDevice, MigMode, check_profile_name

RESOURCE_PREFIX = "mig.gpupool.io/"
MODE_ENABLED = "Enabled"
ANNOTATION_LAYOUT = "gpupool.io/mig-layout"
ANNOTATION_REASON = "gpupool.io/mig-layout-reason"
STATE_APPLIED = "Applied"
STATE_REFUSED = "Refused"
STATE_FAILED = "Failed"


def resource_name(profile: str) -> str:
    """The pod resource of a profile: ``mig.gpupool.io/1g.10gb``."""
    return RESOURCE_PREFIX + check_profile_name(profile)


def profile_of_resource(resource: str) -> str | None:
    """The profile a pod resource names (None: not a MIG resource); ``InvalidInput`` for
    ``mig.gpupool.io/`` followed by something that is not a profile."""
    if not resource.startswith(RESOURCE_PREFIX):
        return None
    try:
        return check_profile_name(resource[len(RESOURCE_PREFIX):])
    except InvalidInput:
        raise InvalidInput(f"{resource} names no MIG profile (like {RESOURCE_PREFIX}1g.10gb)"
                           ) from None


def mig_spec(mig: MigMode | MigDevice | None) -> dict[str, Any] | None:
    """``Gpu.mig`` as ``spec.mig`` (None: an ordinary GPU, no ``spec.mig``)."""
    if mig is None:
        return None
    if isinstance(mig, MigMode):
        return {"mode": MODE_ENABLED}
    return {"parent": mig.parent, "profile": mig.profile,
            "placement": {"start": mig.start, "size": mig.size}, "slices": mig.slices,
            "gpuInstance": mig.gpu_instance, "computeInstance": mig.compute_instance}


def read_mig(value: Any, where: str) -> MigMode | MigDevice | None:
    """``spec.mig`` -> ``Gpu.mig``; ``InvalidInput`` names ``where`` and the field."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where} must be an object")
    if "parent" not in value:
        if value.get("mode") != MODE_ENABLED:
            raise InvalidInput(f"{where}: a GPU in MIG mode says mode: {MODE_ENABLED}, a MIG "
                               "device names its parent")
        return MigMode()
    placement = value.get("placement")
    if not isinstance(placement, Mapping):
        raise InvalidInput(f"{where}.placement must be an object with start and size")
    fields = {"start": placement.get("start"), "size": placement.get("size"),
              "slices": value.get("slices"), "gpuInstance": value.get("gpuInstance", -1),
              "computeInstance": value.get("computeInstance", -1)}
    for key, number in fields.items():
        if isinstance(number, bool) or not isinstance(number, int):
            raise InvalidInput(f"{where}: {key} must be a whole number, got {number!r}")
    parent, profile = value.get("parent"), value.get("profile")
    if not isinstance(parent, str) or not isinstance(profile, str):
        raise InvalidInput(f"{where}: parent and profile must be strings")
    try:
        return MigDevice(parent, profile, fields["start"], fields["size"], fields["slices"],
                         fields["gpuInstance"], fields["computeInstance"])
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
