"""``gpupool keys`` against the FAKE API server: show, rotate, retire (refused while live
decisions use the key)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.cli import keys
from gpupool.kube import keystore
from gpupool.kube.api import KubeApi
from gpupool.security.signing import SigningKeys
from tests.controller.builders import GIB, placed_pod, sign, slices

NS = "gpupool-system"


def run(fake: FakeApiServer, *argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gpupool")
    keys.register(parser.add_subparsers())
    args = parser.parse_args(["keys", "--server", fake.url, *argv])
    return int(args.func(args))


@pytest.fixture
def cluster() -> Iterator[tuple[FakeApiServer, SigningKeys]]:
    with FakeApiServer() as fake:
        api = KubeApi.connect(server=fake.url)
        try:
            signing = keystore.ensure_signing_keys(api, NS, time.time() - 3600)
        finally:
            api.close()
        yield fake, signing


def live_pod(fake: FakeApiServer, name: str, signing: SigningKeys, **kw: Any) -> None:
    pod = placed_pod(name, "lab", "n1", slices("n1", (0, GIB, 10)), **kw)
    fake.seed("pods", sign(pod, signing))


def current(fake: FakeApiServer) -> SigningKeys:
    api = KubeApi.connect(server=fake.url)
    try:
        return keystore.read_signing_keys(api, NS)[0]
    finally:
        api.close()


def test_show_lists_each_key_when_it_signs_and_the_live_decisions_it_signed(
        cluster: tuple[FakeApiServer, SigningKeys], capsys: pytest.CaptureFixture[str]) -> None:
    fake, signing = cluster
    live_pod(fake, "a", signing)
    live_pod(fake, "b", signing)
    live_pod(fake, "done", signing, phase="Succeeded")
    assert run(fake, "show") == 0
    out = capsys.readouterr().out.splitlines()
    kid = signing.keys[0].kid
    assert out[0].split() == ["KEY", "NOT", "BEFORE", "STATE", "LIVE", "DECISIONS"]
    assert out[1].split()[0] == kid and out[1].split()[2:] == ["signing", "2"]


def test_show_names_decisions_signed_by_a_key_gpupool_does_not_publish(
        cluster: tuple[FakeApiServer, SigningKeys], capsys: pytest.CaptureFixture[str]) -> None:
    fake, _ = cluster
    stranger = SigningKeys().added(0.0)
    live_pod(fake, "odd", stranger)
    run(fake, "show")
    out = capsys.readouterr().out
    assert f"{stranger.keys[0].kid}" in out and "not published" in out and "lab/odd" in out


def test_rotate_publishes_a_key_that_signs_after_the_delay(
        cluster: tuple[FakeApiServer, SigningKeys], capsys: pytest.CaptureFixture[str]) -> None:
    fake, signing = cluster
    before = time.time()
    assert run(fake, "rotate", "--activate-after", "10m") == 0
    after = current(fake)
    [fresh] = [k for k in after.keys if k.kid != signing.keys[0].kid]
    assert before + 600 - 2 <= fresh.not_before <= time.time() + 600 + 1
    assert after.active(time.time()).kid == signing.keys[0].kid  # the old key signs until then
    published = fake.get("configmaps", keystore.PUBLIC_CONFIG_MAP, NS) or {}
    assert f"{fresh.kid}.pem" in published["data"]
    assert f"added key {fresh.kid}" in capsys.readouterr().out
    run(fake, "show")
    assert "waits" in capsys.readouterr().out


def test_retire_refuses_a_key_live_decisions_use_and_retires_it_once_they_are_gone(
        cluster: tuple[FakeApiServer, SigningKeys], capsys: pytest.CaptureFixture[str]) -> None:
    fake, signing = cluster
    old = signing.keys[0].kid
    run(fake, "rotate", "--activate-after", "0s")
    live_pod(fake, "a", signing)
    capsys.readouterr()
    assert run(fake, "retire", old) == 1
    err = capsys.readouterr().err
    assert f"key {old} still signs 1 live decisions (lab/a)" in err
    assert old in {k.kid for k in current(fake).keys}
    fake.delete("pods", "a", "lab")
    assert run(fake, "retire", old) == 0
    assert old not in {k.kid for k in current(fake).keys}
    published = fake.get("configmaps", keystore.PUBLIC_CONFIG_MAP, NS) or {}
    assert f"{old}.pem" not in published["data"]


def test_retire_with_force_removes_a_leaked_key_even_in_use(
        cluster: tuple[FakeApiServer, SigningKeys], capsys: pytest.CaptureFixture[str]) -> None:
    fake, signing = cluster
    old = signing.keys[0].kid
    run(fake, "rotate", "--activate-after", "0s")
    live_pod(fake, "a", signing)
    assert run(fake, "retire", old, "--force") == 0
    assert "1 live decisions no longer verify" in capsys.readouterr().out


def test_the_key_signing_now_cannot_be_retired(
        cluster: tuple[FakeApiServer, SigningKeys]) -> None:
    fake, signing = cluster
    with pytest.raises(keystore.KeyMaterialError, match="the one signing now; rotate first"):
        run(fake, "retire", signing.keys[0].kid)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("30s", 30), ("10m", 600),
                                               ("2h", 7200), ("1d", 86400)])
def test_durations_read_as_people_write_them(text: str, seconds: float) -> None:
    assert keys.duration(text) == seconds


def test_a_bad_duration_is_refused_with_an_example() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="such as 30s, 10m or 2h"):
        keys.duration("ten minutes")
