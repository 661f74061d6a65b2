"""The HTTP edge: the starlette apps that answer kube-scheduler's verbs and the probes
(``app``), the body limits sized to the cluster (``sizing``), uvicorn on the serving port
or a thread (``server``), connection rules (``connections``; framing, the rules'
mechanics and uvicorn's configuration are ``gpupool.http``'s, shared with the webhook) and
mutual TLS that reloads its certificates (``tls``). It calls ``service.Extender`` and
decides nothing itself."""
