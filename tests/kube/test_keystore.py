"""Decision keys in the cluster: made once, published, rotated, read by verifiers."""

from __future__ import annotations

import base64
import threading

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract.annotations import encode
from gpupool.core.allocation import Allocation, Slice
from gpupool.kube import keystore
from gpupool.kube.api import KubeApi
from gpupool.security.signing import KeyMaterialError, SignatureError, claims_of

NS = "gpupool-system"
NOW = 1_800_000_000.0


def _notes() -> dict[str, str]:
    alloc = Allocation("uid-1", "n1", 0, 0, (Slice("GPU-a", 0, 1024, 10, "main"),))
    return encode(alloc, "2026-11-23T10:00:00.000000Z")


def test_the_first_start_makes_one_key_and_publishes_it(api: KubeApi,
                                                        fake: FakeApiServer) -> None:
    keys = keystore.ensure_signing_keys(api, NS, NOW)
    assert len(keys.keys) == 1
    secret = fake.get("secrets", keystore.SIGNING_SECRET, NS)
    assert secret is not None and f"{keys.keys[0].kid}.json" in secret["data"]
    base64.b64decode(secret["data"][f"{keys.keys[0].kid}.json"])  # stored base64, as real
    cm = fake.get("configmaps", keystore.PUBLIC_CONFIG_MAP, NS)
    assert cm is not None and list(cm["data"]) == [f"{keys.keys[0].kid}.pem"]
    again = keystore.ensure_signing_keys(api, NS, NOW + 5)
    assert [k.kid for k in again.keys] == [k.kid for k in keys.keys]


def test_replicas_starting_together_agree_on_one_key(fake: FakeApiServer) -> None:
    results: list[str] = []

    def start() -> None:
        kube = KubeApi.connect(server=fake.url)
        try:
            results.append(keystore.ensure_signing_keys(kube, NS, NOW).active(NOW).kid)
        finally:
            kube.close()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 4 and len(set(results)) == 1


def test_a_rotated_key_reaches_a_verifier_without_a_restart(api: KubeApi) -> None:
    clock = [NOW]
    keys = keystore.ensure_signing_keys(api, NS, NOW)
    source = keystore.KeyRingSource(api, NS, lambda: clock[0], refresh_s=10)
    notes = _notes()
    claims = claims_of("uid-1", "team-a", "web", notes)
    assert source.verify("uid-1", "team-a", "web", notes, keys.active(NOW).sign(claims))
    rotated = keystore.rotate(api, NS, NOW, delay_s=60)
    assert rotated.active(NOW).kid == keys.active(NOW).kid  # not signing yet
    new = rotated.active(NOW + 61)
    clock[0] = NOW + 61
    assert source.verify("uid-1", "team-a", "web", notes, new.sign(claims)) == new.kid


def test_an_unknown_key_is_read_again_at_most_every_refresh_period(
        api: KubeApi, fake: FakeApiServer) -> None:
    keystore.ensure_signing_keys(api, NS, NOW)
    clock = [NOW]
    source = keystore.KeyRingSource(api, NS, lambda: clock[0], refresh_s=10)
    foreign = keystore.SigningKeys().added(NOW)
    notes = _notes()
    signature = foreign.active(NOW).sign(claims_of("uid-1", "team-a", "web", notes))
    before = len(fake.requests)
    for _ in range(5):
        with pytest.raises(SignatureError, match="not one of gpupool's published"):
            source.verify("uid-1", "team-a", "web", notes, signature)
    reads = [r for r in fake.requests[before:] if "configmaps" in r[1]]
    assert len(reads) == 1


def test_retiring_the_signing_key_is_refused(api: KubeApi) -> None:
    keys = keystore.ensure_signing_keys(api, NS, NOW)
    with pytest.raises(KeyMaterialError, match="signing now"):
        keystore.retire(api, NS, keys.active(NOW).kid, NOW)
    rotated = keystore.rotate(api, NS, NOW, 1)
    left = keystore.retire(api, NS, keys.active(NOW).kid, NOW + 2)
    assert [k.kid for k in left.keys] == [rotated.keys[-1].kid]


def test_without_published_keys_every_decision_is_refused(api: KubeApi) -> None:
    source = keystore.KeyRingSource(api, NS, lambda: NOW)
    with pytest.raises(KeyMaterialError, match="cannot be read"):
        source.verify("uid-1", "team-a", "web", _notes(), "v1.0123456789abcdef.AA")


class Reader:
    """A ``KeyRingSource`` on a clock the test moves, and one pod's decision, signed with
    the key the extender signs with at ``NOW``."""

    def __init__(self, api: KubeApi):
        self.clock = NOW
        self.keys = keystore.ensure_signing_keys(api, NS, NOW)
        self.source = keystore.KeyRingSource(api, NS, lambda: self.clock, refresh_s=10,
                                             max_age_s=60)
        self.notes = _notes()
        self.signature = self.keys.active(NOW).sign(claims_of("uid-1", "team-a", "web",
                                                              self.notes))

    def verify_at(self, t: float) -> str:
        self.clock = NOW + t
        return self.source.verify("uid-1", "team-a", "web", self.notes, self.signature)


def test_a_retired_key_stops_verifying_once_the_ring_is_older_than_its_max_age(
        api: KubeApi) -> None:
    reader = Reader(api)
    assert reader.verify_at(0)
    keystore.rotate(api, NS, NOW, delay_s=1)
    keystore.retire(api, NS, reader.keys.active(NOW).kid, NOW + 2)  # a leaked key, say
    assert reader.verify_at(59)  # not read again yet
    with pytest.raises(SignatureError, match="not one of gpupool's published") as err:
        reader.verify_at(60)
    assert err.value.code == SignatureError.UNKNOWN_KEY
    assert reader.source.stats().forgotten == 1


def test_a_ring_that_cannot_be_read_again_is_kept_and_read_again_later(
        api: KubeApi, fake: FakeApiServer) -> None:
    reader = Reader(api)
    assert reader.verify_at(0)
    fake.delete("configmaps", keystore.PUBLIC_CONFIG_MAP, NS)
    assert reader.verify_at(61)  # the last ring read
    keystore.publish(api, NS, keystore.SigningKeys().added(NOW))  # another key only
    assert reader.verify_at(65)  # read again at most every 10 s
    with pytest.raises(SignatureError, match="not one of gpupool's published"):
        reader.verify_at(71)


def test_a_reader_started_before_the_keys_reads_them_within_a_second_of_their_publication(
        api: KubeApi, fake: FakeApiServer) -> None:
    clock = [NOW]
    source = keystore.KeyRingSource(api, NS, lambda: clock[0], refresh_s=10)
    notes = _notes()

    def reads_at(t: float) -> int:
        clock[0] = NOW + t
        before = len(fake.requests)
        with pytest.raises(KeyMaterialError, match="cannot be read"):
            source.verify("uid-1", "team-a", "web", notes, "v1.0123456789abcdef.AA")
        return sum(1 for _, path in fake.requests[before:] if "configmaps" in path)

    # waits of 0.05 s, doubling, never more than a second
    checks = [0, 0.01, 0.06, 0.1, 0.17, 0.3, 0.4, 0.7, 0.85, 1.6, 1.7, 2.6, 2.75, 3.8]
    assert [reads_at(t) for t in checks] == [1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1]
    keys = keystore.ensure_signing_keys(api, NS, NOW)  # the extender starts
    clock[0] = NOW + 4.85
    signature = keys.active(NOW).sign(claims_of("uid-1", "team-a", "web", notes))
    assert source.verify("uid-1", "team-a", "web", notes, signature) == keys.keys[0].kid


def test_keys_that_cannot_be_read_are_refused_with_what_to_do(api: KubeApi) -> None:
    source = keystore.KeyRingSource(api, NS, lambda: NOW)
    with pytest.raises(KeyMaterialError) as err:
        source.ring()
    message = str(err.value)
    assert "not found" in message and f"ConfigMap {NS}/{keystore.PUBLIC_CONFIG_MAP}" in message
    assert "check that it runs" in message
