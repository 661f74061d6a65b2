"""``KubeApi`` over TLS: the fake API server's app under uvicorn with a certificate from a
throw-away CA, requiring a client certificate from the same CA. ``KubeApi`` (lightkube on
gpupool's transport) must accept the kubeconfig's CA and client certificate, given as
data or as files, keep them across a ``fork``, and refuse a server their CA did not
sign."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from gpupool_testing.fake_apiserver import FakeApiServer
from lightkube.config.kubeconfig import KubeConfig

from gpupool.kube.api import KubeApi
from gpupool.kube.errors import KubeError

from .test_api import pod

trustme = pytest.importorskip("trustme")


class TlsFake:
    """A fake API server on https://127.0.0.1 that requires a client certificate."""

    def __init__(self, tmp: Path):
        self.ca = trustme.CA()
        self.client = self.ca.issue_cert("gpupool-extender")
        server_cert = self.ca.issue_cert("127.0.0.1", "localhost")
        self.files = {"ca": tmp / "ca.pem", "cert": tmp / "client.pem",
                      "key": tmp / "client-key.pem"}
        self.ca.cert_pem.write_to_path(str(self.files["ca"]))
        self.client.cert_chain_pems[0].write_to_path(str(self.files["cert"]))
        self.client.private_key_pem.write_to_path(str(self.files["key"]))
        server_cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))
        self.fake = FakeApiServer()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.fake.app, log_level="warning", lifespan="off",
                                access_log=False, timeout_graceful_shutdown=1,
                                ssl_certfile=str(tmp / "server.pem"),
                                ssl_ca_certs=str(self.files["ca"]),
                                ssl_cert_reqs=ssl.CERT_REQUIRED)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        while not self.server.started:
            assert self.thread.is_alive(), "the TLS fake API server did not start"
            threading.Event().wait(0.01)

    def stop(self) -> None:
        self.fake.stop()  # ends open watches
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def kubeconfig(self, *, as_data: bool, ca: bool = True, insecure: bool = False,
                   client_cert: bool = True) -> dict[str, Any]:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        cluster: dict[str, Any] = {"server": self.url}
        user: dict[str, Any] = {}
        if ca:
            cluster.update({"certificate-authority-data": b64(self.files["ca"])} if as_data
                           else {"certificate-authority": "ca.pem"})
        if insecure:
            cluster["insecure-skip-tls-verify"] = True
        if client_cert and as_data:
            user = {"client-certificate-data": b64(self.files["cert"]),
                    "client-key-data": b64(self.files["key"])}
        elif client_cert:
            user = {"client-certificate": "client.pem", "client-key": "client-key.pem"}
        return {"clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x"}


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[TlsFake]:
    server = TlsFake(tmp_path)
    yield server
    server.stop()


def connect(tmp_path: Path, conf: dict[str, Any]) -> KubeApi:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(conf))  # relative file names resolve next to it
    return KubeApi(KubeConfig.from_file(path), timeout_s=5, trust_env=False)


@pytest.mark.parametrize("as_data", [True, False], ids=["certificates as data",
                                                        "certificates as files"])
def test_binds_ledgers_and_watches_work_over_tls_with_a_client_certificate(
        tls: TlsFake, tmp_path: Path, as_data: bool) -> None:
    api = connect(tmp_path, tls.kubeconfig(as_data=as_data))
    try:
        uid = tls.fake.seed("pods", pod("a"))["metadata"]["uid"]
        rv = api.list_ledgers().resource_version
        created = api.create_ledger({"metadata": {"name": "n1"}, "spec": {"entries": {}}})
        api.patch_ledger("n1", {"spec": {"entries": {"u": {"pod": "a"}}}},
                         created["metadata"]["resourceVersion"])
        api.bind_pod("default", "a", uid, "n1")
        events = []
        for kind, obj in api.watch_ledgers(rv, timeout_s=2):
            events.append((kind, sorted(obj["spec"]["entries"])))
            if len(events) == 2:
                break
        assert events == [("ADDED", []), ("MODIFIED", ["u"])]
        assert tls.fake.get("pods", "a", "default")["spec"]["nodeName"] == "n1"
        forked = api.fork()  # a watch thread's connection: the same CA and certificate
        assert forked.get_ledger("n1")["metadata"]["name"] == "n1"
        forked.close()
    finally:
        api.close()


def test_insecure_skip_tls_verify_needs_no_ca(tls: TlsFake, tmp_path: Path) -> None:
    api = connect(tmp_path, tls.kubeconfig(as_data=True, ca=False, insecure=True))
    try:
        api.create_ledger({"metadata": {"name": "n1"}, "spec": {"entries": {}}})
        assert api.get_ledger("n1")["metadata"]["name"] == "n1"
    finally:
        api.close()


def test_a_server_signed_by_another_ca_is_refused(tls: TlsFake, tmp_path: Path) -> None:
    other = trustme.CA()
    conf = tls.kubeconfig(as_data=True)
    conf["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(
        other.cert_pem.bytes()).decode()
    api = connect(tmp_path, conf)
    try:
        with pytest.raises(KubeError, match=r"^get GPULedger n1: .*CERTIFICATE_VERIFY_FAILED"
                           ) as e:
            api.get_ledger("n1")
        assert e.value.code == 0
    finally:
        api.close()


def test_without_the_client_certificate_the_server_refuses(tls: TlsFake,
                                                          tmp_path: Path) -> None:
    api = connect(tmp_path, tls.kubeconfig(as_data=True, client_cert=False))
    try:
        with pytest.raises(KubeError, match=r"^get GPULedger n1: ") as e:
            api.get_ledger("n1")
        assert e.value.code == 0
    finally:
        api.close()
