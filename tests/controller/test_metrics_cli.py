"""Two ``gpupool controller`` processes against the FAKE API server, scraped over HTTP:
one leads and exports the cluster's figures, the other follows with /healthz fine and
no figures; when the leader is stopped (SIGTERM) the follower takes over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from prometheus_client.parser import text_string_to_metric_families

from gpupool.kube.keystore import PUBLIC_CONFIG_MAP
from tests.controller.builders import GIB, RING, device, group, placed_pod, slices
from tests.ports import free_port
from tests.waiting import wait_for

NS = "gpupool-system"
TIMING = ["--lease-duration-seconds", "15", "--renew-deadline-seconds", "10",
          "--retry-period-seconds", "1"]
"""Lease calls time out after a retry period and a leader stops after a renew deadline
without a renewal: a loaded machine reaches neither (the takeover under test is the one
that follows a leader's release, on the follower's next try, not the Lease's expiry)."""


def scrape(port: int) -> dict[str, float]:
    """``name{a="b"}`` -> value (labels sorted), or {} while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as r:
        return int(r.status)


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for i in range(2):
            server.seed("gpudevices", device("n1", i, labels={"gpupool.io/pool": "train"}))
        server.seed("resourcegroups", group("team", nodes=["n1"], quota={"gpus": 2}))
        server.seed("pods", placed_pod("a", "lab", "n1", slices("n1", (0, 8 * GIB, 50)),
                                       group_name="team"))
        server.seed("configmaps", {"metadata": {"name": PUBLIC_CONFIG_MAP, "namespace": NS},
                                   "data": RING.to_data()})
        yield server


def controller(fake: FakeApiServer, name: str, port: int, log: Path
               ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "POD_NAME": name, "POD_NAMESPACE": NS}
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", "controller", "--server", fake.url,
             "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
             *TIMING, "--no-device-classes", "--log-level", "INFO"],
            env=env, stdout=subprocess.DEVNULL, stderr=out)


def test_two_controllers_one_leads_and_exports_the_other_takes_over_when_it_stops(
        fake: FakeApiServer, tmp_path: Path) -> None:
    ports = {"ctl-a": free_port(), "ctl-b": free_port()}
    procs = {n: controller(fake, n, p, tmp_path / f"{n}.log") for n, p in ports.items()}
    try:
        def leading() -> list[str]:
            return [n for n, p in ports.items() if scrape(p).get("gpupool_controller_is_leader")]
        assert wait_for(lambda: len(leading()) == 1 and all(
            "gpupool_controller_is_leader" in scrape(p) for p in ports.values()))
        (leader,) = leading()
        (follower,) = set(ports) - {leader}
        assert wait_for(lambda: "gpupool_controller_gpus{model=\"A100-SXM4-80GB\","
                                "pool=\"train\"}" in scrape(ports[leader]))
        got = scrape(ports[leader])
        assert got['gpupool_controller_quota_used_gpus{name="team",scope="group"}'] == 1
        assert got['gpupool_controller_quota_limit_gpus{name="team",scope="group"}'] == 2
        assert got['gpupool_controller_gpus_allocated{model="A100-SXM4-80GB",pool="train"}'] \
            == 0.5
        holder = (fake.get("leases", "gpupool-controller", NS) or {})["spec"]["holderIdentity"]
        assert holder.startswith(leader + "_")
        assert got[f'gpupool_controller_leader_info{{holder="{holder}"}}'] == 1
        # The follower learns the holder on its next read of the Lease, which may
        # come a retry period after the leader's first export.
        info = f'gpupool_controller_leader_info{{holder="{holder}"}}'
        assert wait_for(lambda: scrape(ports[follower]).get(info) == 1)
        seen = scrape(ports[follower])
        assert seen["gpupool_controller_is_leader"] == 0
        assert seen[info] == 1
        assert not any(k.startswith(("gpupool_controller_gpus", "gpupool_controller_quota"))
                       for k in seen)
        assert healthz(ports[follower]) == healthz(ports[leader]) == 200

        procs[leader].send_signal(signal.SIGTERM)
        assert procs[leader].wait(30) == 0
        assert wait_for(lambda: scrape(ports[follower]).get("gpupool_controller_is_leader")
                        == 1)
        assert wait_for(lambda: 'gpupool_controller_quota_used_gpus{name="team",'
                                'scope="group"}' in scrape(ports[follower]))
        spec = (fake.get("leases", "gpupool-controller", NS) or {})["spec"]
        assert spec["holderIdentity"].startswith(follower + "_")
        assert spec["leaseTransitions"] == 1
        logs = {n: (tmp_path / f"{n}.log").read_text() for n in ports}
        assert "gave the lease up" in logs[leader] and "leads (term 1" in logs[follower]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
