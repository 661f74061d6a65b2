"""What ``gpupool webhook`` does once its flags are checked and the cluster is reached:
get a serving certificate, watch namespaces (their placement labels), serve admission
reviews over HTTPS and /metrics, and keep the certificate and the caBundle current, until
SIGTERM.

Kept apart from the command's flags (``gpupool.cli.webhook``) so that a bad flag or a
kubeconfig that cannot be used is said before these modules (starlette, uvicorn,
cryptography, Prometheus, the webhook's own) load.
"""

from __future__ import annotations

import argparse
import logging
import signal
import tempfile
import threading
import time
from pathlib import Path

from prometheus_client import start_http_server

from gpupool.cli.webhook import plan_of, settings_of, sizes_of
from gpupool.kube.errors import KubeError
from gpupool.kube.webhook_ops import WebhookApi
from gpupool.webhook.certificates import CertificateKeeper
from gpupool.webhook.metrics import Metrics
from gpupool.webhook.namespaces import NamespaceView
from gpupool.webhook.server import HttpsServer, WebhookApp
from gpupool.webhook.tls import ServingTls

log = logging.getLogger("gpupool.webhook")
NAMESPACE_READ_S = 2.0
"""How long a review waits to read a namespace its watch has not shown yet: well within
the API server's 5 s for the whole call (``timeoutSeconds`` of the configurations)."""


def serve(args: argparse.Namespace, api: WebhookApi) -> int:
    """Serve through ``api`` until SIGTERM (exit code 0); ``api`` is closed at the end."""
    metrics = Metrics()
    tls = ServingTls(Path(args.cert_dir or tempfile.mkdtemp(prefix="gpupool-webhook-")))
    keeper = CertificateKeeper(api, plan_of(args), tls, time.time, metrics)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        _first_certificate(keeper, stop)
        if stop.is_set():
            return 0
        quick = api.with_timeout(NAMESPACE_READ_S)  # a namespace the watch has not shown
        view = NamespaceView(quick.get_namespace_labels)
        informer = view.informer(api).start()
        sizes = sizes_of(args)
        app = WebhookApp(settings_of(args, api.fork(), view.placement_of), metrics,
                         lambda: tls.loaded, sizes)
        server = HttpsServer(app.app, tls, args.host, args.port, sizes=sizes,
                             closed=metrics.closed)
        port = server.start()
        if args.metrics_port:
            start_http_server(args.metrics_port, registry=metrics.registry)
        log.info("serving admission reviews on https://%s:%d (metrics on :%s)", args.host, port,
                 args.metrics_port or "off")
        threading.Thread(target=keeper.run, args=(stop, args.check_seconds), daemon=True,
                         name="certificates").start()
        stop.wait()
        server.stop()
        informer.signal_stop()
        quick.close()
        return 0
    finally:
        stop.set()
        api.close()


def _first_certificate(keeper: CertificateKeeper, stop: threading.Event) -> None:
    """Until a certificate is served (the server cannot start without one)."""
    while not stop.is_set():
        try:
            keeper.refresh()
            return
        except (KubeError, ValueError) as exc:
            log.warning("no serving certificate yet (retried in 5 s): %s", exc)
            stop.wait(5.0)
