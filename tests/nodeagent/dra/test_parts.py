"""The DRA plugin's parts on their own: the checkpoint file, the claim's users, CDI specs."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.dra.cdi import CdiSpecs, spec_of
from gpupool.nodeagent.dra.checkpoint import (
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    _claim_json,
    _digest,
)
from gpupool.nodeagent.dra.users import claim_users, env_refusal
from gpupool.nodeagent.envs import ContainerEdits, Mount

from .builders import claim_pod

CLAIM = PreparedClaim("u1", "ns", "c", (PreparedDevice("gpu", "n", "gpu-0", "GPU-0", 1024, 10,
                                                       False, ("gpu.gpupool.io/claim=u1",)),),
                      ContainerEdits({"A": "1"}, (Mount("/in", "/out", True),)))


def test_the_checkpoint_reads_back_what_it_wrote_one_file_per_claim(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "dra" / "claims")
    assert cp.load() == {}
    cp.put(CLAIM)
    cp.put(replace(CLAIM, uid="u2"))
    assert sorted(p.name for p in cp.path.iterdir()) == ["u1.json", "u2.json"]
    assert Checkpoint(cp.path).load() == {"u1": CLAIM, "u2": replace(CLAIM, uid="u2")}
    cp.drop("u2")
    cp.drop("never-prepared")
    assert Checkpoint(cp.path).load() == {"u1": CLAIM}


@pytest.mark.parametrize("damage", [
    lambda b: b[: len(b) // 2],  # torn by a crash
    lambda b: b.replace(b'"corePct":10', b'"corePct":100'),  # edited
    lambda b: b.replace(b'"version": 2', b'"version": 9'),  # another version
    lambda b: b"{not json",
])
def test_an_unreadable_claim_file_is_set_aside_and_the_others_kept(
        tmp_path: Path, damage: Callable[[bytes], bytes]) -> None:
    cp = Checkpoint(tmp_path)
    cp.put(CLAIM)
    cp.put(replace(CLAIM, uid="u2"))
    broken = damage((tmp_path / "u1.json").read_bytes())
    (tmp_path / "u1.json").write_bytes(broken)
    assert cp.load() == {"u2": replace(CLAIM, uid="u2")}
    assert (tmp_path / "u1.json.unreadable").read_bytes() == broken
    assert not (tmp_path / "u1.json").exists()


def test_a_claim_file_renamed_to_another_claim_is_not_trusted(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path)
    cp.put(CLAIM)
    (tmp_path / "u1.json").rename(tmp_path / "u9.json")
    assert cp.load() == {}


def test_an_interrupted_write_leaves_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path)
    cp.put(CLAIM)
    (tmp_path / ".u1.json.tmp").write_bytes(b'{"version": 2, "ui')
    assert cp.load() == {"u1": CLAIM}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u1.json"]


def test_the_single_file_of_earlier_versions_is_taken_over(tmp_path: Path) -> None:
    legacy = tmp_path / "checkpoint.json"
    body = {"u1": _claim_json(CLAIM)}
    legacy.write_text(json.dumps({"version": 1, "claims": body, "checksum": _digest(body)}))
    cp = Checkpoint(tmp_path / "claims", legacy)
    assert cp.load() == {"u1": CLAIM}
    assert not legacy.exists() and Checkpoint(cp.path).load() == {"u1": CLAIM}
    legacy.write_text('{"version": 1, "claims": {}, "checksum": "x"}')
    assert cp.load() == {"u1": CLAIM}  # the broken one set aside, the claim files kept
    assert (tmp_path / "checkpoint.json.unreadable").exists()


def test_a_takeover_that_cannot_write_keeps_the_earlier_file_and_its_claims(
        tmp_path: Path) -> None:
    legacy = tmp_path / "checkpoint.json"
    body = {"u1": _claim_json(CLAIM)}
    legacy.write_text(json.dumps({"version": 1, "claims": body, "checksum": _digest(body)}))
    (tmp_path / "claims").write_text("a file where the claims' folder should be")
    cp = Checkpoint(tmp_path / "claims", legacy)
    assert cp.load() == {"u1": CLAIM}  # nothing forgotten
    assert legacy.exists() and not (tmp_path / "checkpoint.json.unreadable").exists()


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


def test_a_container_served_an_extended_resource_through_dra_is_a_user_of_its_claim() -> None:
    pod = claim_pod("p", "c1")
    pod["spec"]["containers"].append({"name": "ext", "resources": {"limits": {
        "gpupool.io/gpu": "1"}}, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})
    pod["status"] = {"extendedResourceClaimStatus": {
        "resourceClaimName": "p-extended-resources-abc", "requestMappings": [
            {"containerName": "ext", "resourceName": "gpupool.io/gpu",
             "requestName": "container-1-request-0"}]}}
    assert [c.name for c in claim_users(pod, "p-extended-resources-abc")] == ["ext"]
    assert "NVIDIA_VISIBLE_DEVICES" in (env_refusal([pod], "p-extended-resources-abc") or "")
    assert env_refusal([pod], "c1") is None
