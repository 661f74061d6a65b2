"""The DRA plugin's parts on their own: the checkpoint file, the claim's users, CDI specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.dra.cdi import CdiSpecs, spec_of
from gpupool.nodeagent.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from gpupool.nodeagent.dra.users import claim_users, env_refusal
from gpupool.nodeagent.envs import ContainerEdits, Mount

from .builders import claim_pod

CLAIM = PreparedClaim("u1", "ns", "c", (PreparedDevice("gpu", "n", "gpu-0", "GPU-0", 1024, 10,
                                                       False, ("gpu.gpupool.io/claim=u1",)),),
                      ContainerEdits({"A": "1"}, (Mount("/in", "/out", True),)))


def test_the_checkpoint_reads_back_what_it_wrote(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "dra" / "checkpoint.json")
    assert cp.load() == {}
    cp.save({"u1": CLAIM})
    assert Checkpoint(cp.path).load() == {"u1": CLAIM}


@pytest.mark.parametrize("damage", ["{not json", '{"version": 1, "claims": {}, "checksum": "x"}',
                                    '{"version": 9, "claims": {}}'])
def test_an_unreadable_checkpoint_is_set_aside_not_trusted(tmp_path: Path, damage: str) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.save({"u1": CLAIM})
    cp.path.write_text(damage)
    assert cp.load() == {}
    assert (tmp_path / "checkpoint.json.unreadable").read_text() == damage
    assert not cp.path.exists()


def test_an_edited_claim_in_the_checkpoint_fails_its_checksum(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.save({"u1": CLAIM})
    cp.path.write_text(cp.path.read_text().replace('"corePct":10', '"corePct":100'))
    assert cp.load() == {}


def test_cdi_specs_name_the_claim_and_refuse_uids_that_are_paths(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    assert specs.write("u1", CLAIM.edits) == "gpu.gpupool.io/claim=u1"
    assert specs.known() == {"u1"}
    spec = spec_of("u1", CLAIM.edits)
    assert spec["devices"][0]["containerEdits"] == {
        "env": ["A=1"], "mounts": [{"hostPath": "/out", "containerPath": "/in",
                                    "options": ["ro", "nosuid", "nodev", "bind"]}]}
    with pytest.raises(InvalidInput, match="not a Kubernetes uid"):
        specs.write("../../etc/passwd", CLAIM.edits)


def test_the_users_of_a_claim_are_the_containers_listing_its_entry() -> None:
    pod = claim_pod("p", "c1")
    pod["spec"]["containers"].append({"name": "other", "resources": {"claims": [{"name": "x"}]},
                                      "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})
    pod["spec"]["resourceClaims"].append({"name": "x", "resourceClaimName": "someone-elses"})
    assert [c.name for c in claim_users(pod, "c1")] == ["main"]
    assert env_refusal([pod], "c1") is None
    assert "NVIDIA_VISIBLE_DEVICES" in (env_refusal([pod], "someone-elses") or "")


def test_a_templated_claim_not_yet_in_the_pod_status_checks_every_claim_user() -> None:
    pod = claim_pod("p", "c1")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "cm"}}]
    assert "envFrom" in (env_refusal([pod], "p-gpu-abcde") or "")
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu",
                                                "resourceClaimName": "p-gpu-abcde"}]}
    assert [c.name for c in claim_users(pod, "p-gpu-abcde")] == ["main"]
    assert claim_users(pod, "unrelated") == []
