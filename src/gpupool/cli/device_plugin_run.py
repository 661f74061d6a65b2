"""What ``gpupool device-plugin`` does once its flags are checked, its GPUs found and the
cluster reached: the device plugin (or, on a DRA node, the DRA driver), its isolation
provider, decision verifier, usage monitor and metrics, until SIGTERM.

Kept apart from the command's flags (``gpupool.cli.device_plugin``) so that a bad flag,
a missing node name or fake GPU file, or a kubeconfig that cannot be used is said before
these modules (gRPC, Prometheus, the node agent's own) load.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from gpupool.cli.device_plugin import AUTO
from gpupool.contract import dra
from gpupool.contract.isolation import ProviderName
from gpupool.contract.slices import client_env
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.kube.api import DraApi, KubeApi
from gpupool.kube.errors import NotFound
from gpupool.kube.keystore import PUBLIC_CONFIG_MAP, KeyRingSource
from gpupool.nodeagent.actions import OveruseAction
from gpupool.nodeagent.agent import AgentConfig, Guards, NodeAgent
from gpupool.nodeagent.dra.claimsource import KubeDraCluster
from gpupool.nodeagent.dra.plugin import DraAgent, DraConfig
from gpupool.nodeagent.dra.pods import ClaimPods
from gpupool.nodeagent.dra.versions import nvml_versions
from gpupool.nodeagent.dra.watch import DraGuards
from gpupool.nodeagent.exposure import Exposure
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.fakemig import FakeMigDriver
from gpupool.nodeagent.freezer import Freezer
from gpupool.nodeagent.gpu import GpuBackend
from gpupool.nodeagent.isolation.computemode import ComputeModeClient
from gpupool.nodeagent.isolation.hamicore import HamiCoreProvider
from gpupool.nodeagent.isolation.mps import MpsProvider
from gpupool.nodeagent.isolation.mpsdaemon import MpsLayout
from gpupool.nodeagent.isolation.none import NoIsolation
from gpupool.nodeagent.isolation.provider import NODE_LABEL, IsolationProvider
from gpupool.nodeagent.kubeview import KubeEvents, KubeEvictions, KubeInventory, KubePods
from gpupool.nodeagent.logical import Split
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.metrics import serve as serve_metrics
from gpupool.nodeagent.mig import MigDriver
from gpupool.nodeagent.monitor import MonitorConfig
from gpupool.nodeagent.nvml import NvmlGpuBackend
from gpupool.nodeagent.nvmlmig import NvmlMigDriver
from gpupool.nodeagent.overuse import OveruseConfig
from gpupool.nodeagent.verify import MEMO_LIMIT, Verifier

log = logging.getLogger("gpupool.cli.device_plugin")


def serve(args: argparse.Namespace, api: DraApi, backend: GpuBackend,
          exposure: Exposure) -> int:
    """Serve this node through ``api`` (the device plugin, or the DRA driver of a DRA node)
    until SIGTERM (exit code 0)."""
    config = AgentConfig(args.node_name, args.kubelet_dir,
                         Split(args.split, args.mib_per_device), args.memory_unit,
                         args.heartbeat_seconds, decide_unscheduled=args.decide_unscheduled,
                         monitor_s=args.monitor_seconds, proc_root=args.proc_root,
                         mig_interval_s=args.mig_interval_seconds,
                         slice_namespace=args.slice_namespace,
                         slice_client=client_env(args.remote_provider,
                                                 args.lupine_client_library)
                         if args.remote_provider != "none" else ())
    if _mode(args, api) == dra.MODE_DRA:
        return _run_dra(args, api, backend, exposure)
    metrics = NodeMetrics()
    guards = Guards(
        verifier=None if args.decide_unscheduled else _verifier(api, args.namespace),
        exposure=exposure, provider=_provider(args, api, backend),
        events=KubeEvents(api, args.node_name), evictions=KubeEvictions(api), metrics=metrics,
        overuse=OveruseConfig(args.grace_seconds, args.compute_window_seconds,
                              args.memory_tolerance_mib, args.compute_tolerance_pct),
        action=OveruseAction(args.over_use_action),
        freezer=Freezer(args.proc_root, args.cgroup_root),
        device_events=KubeEvents(api, args.node_name))
    pods = KubePods(api)
    agent = NodeAgent(config, backend, pods, KubeInventory(api.fork()), guards=guards,
                      mig_driver=_mig_driver(args, backend))
    server = serve_metrics(metrics, args.metrics_address, args.metrics_port) \
        if args.metrics_port else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    pods.start(config.node)
    agent.start()
    try:
        stop.wait()
    finally:
        agent.stop()
        pods.stop(wait=False)
        if server is not None:
            server.shutdown()
        api.close()
    return 0


def _mig_driver(args: argparse.Namespace, backend: GpuBackend) -> MigDriver | None:
    """What makes the MIG layouts asked of this node (None: --mig-on-demand is off)."""
    if not args.mig_on_demand:
        return None
    if isinstance(backend, FakeGpuBackend):
        return FakeMigDriver(backend)
    assert isinstance(backend, NvmlGpuBackend)
    return NvmlMigDriver(backend.rescan_mig)


def _mode(args: argparse.Namespace, api: KubeApi) -> str:
    """The path this node serves: ``--mode``, or the node's label (absent: device-plugin)."""
    if args.mode != AUTO:
        return str(args.mode)
    try:
        node = api.get_node(args.node_name)
    except NotFound:
        log.warning("node %s not found: serving the device plugin (give --mode)", args.node_name)
        return dra.MODE_DEVICE_PLUGIN
    labels = (node.metadata.labels if node.metadata else None) or {}
    mode = labels.get(dra.NODE_MODE_LABEL, dra.MODE_DEVICE_PLUGIN)
    if mode not in (dra.MODE_DEVICE_PLUGIN, dra.MODE_DRA):
        raise InvalidInput(f"node {args.node_name}: label {dra.NODE_MODE_LABEL}={mode!r} names "
                           f"no mode ({dra.MODE_DEVICE_PLUGIN} or {dra.MODE_DRA})")
    return str(mode)


def _run_dra(args: argparse.Namespace, api: DraApi, backend: GpuBackend,
             exposure: Exposure) -> int:
    """The DRA kubelet plugin for this node (one mode per node: no device plugin)."""
    versions = nvml_versions() if isinstance(backend, NvmlGpuBackend) else {}
    config = DraConfig(args.node_name, args.kubelet_dir, args.cdi_dir, args.state_dir,
                       args.memory_unit, args.heartbeat_seconds,
                       args.slice_resync_seconds, versions=versions)
    guards = _dra_guards(args, api)
    agent = DraAgent(config, backend, KubeDraCluster(api), KubeInventory(api.fork()),
                     exposure=exposure, provider=_provider(args, api, backend), guards=guards)
    log.info("node %s serves GPUs through DRA (driver %s); the device plugin is off",
             args.node_name, dra.DRIVER)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = serve_metrics(guards.metrics, args.metrics_address, args.metrics_port) \
        if args.metrics_port and guards.metrics is not None else None
    guards.pods.start(args.node_name)
    agent.start()
    try:
        stop.wait()
    finally:
        agent.stop()
        guards.pods.stop(wait=False)
        if server is not None:
            server.shutdown()
        api.close()
    return 0


def _dra_guards(args: argparse.Namespace, api: KubeApi) -> DraGuards:
    """The usage monitor of a DRA node: the same flags as on the device-plugin path."""
    return DraGuards(
        ClaimPods(api), MonitorConfig(args.node_name, args.proc_root, args.monitor_seconds),
        OveruseConfig(args.grace_seconds, args.compute_window_seconds,
                      args.memory_tolerance_mib, args.compute_tolerance_pct),
        OveruseAction(args.over_use_action), KubeEvents(api, args.node_name),
        KubeEvictions(api), NodeMetrics(), Freezer(args.proc_root, args.cgroup_root))


def _verifier(api: KubeApi, namespace: str) -> Verifier:
    keys = KeyRingSource(api, namespace, time.time, memo_limit=MEMO_LIMIT)
    try:
        ring = keys.ring()
        log.info("decision keys %s from ConfigMap %s/%s", ", ".join(ring.keys) or "(none)",
                 namespace, PUBLIC_CONFIG_MAP)
    except GpupoolError as exc:
        log.warning("decision keys not readable yet (every decision is refused until they "
                    "are): %s", exc)
    return keys.verify


def _provider(args: argparse.Namespace, api: KubeApi, backend: GpuBackend
              ) -> IsolationProvider:
    name = args.isolation_provider
    if name == AUTO:
        node = api.get_node(args.node_name)
        labels = (node.metadata.labels if node.metadata else None) or {}
        name = labels.get(NODE_LABEL, ProviderName.NONE.value)
        if name not in {n.value for n in ProviderName}:
            raise InvalidInput(f"node {args.node_name}: label {NODE_LABEL}={name!r} names no "
                               f"isolation provider (mps, hami-core or none)")
    if name == ProviderName.MPS:
        modes = ComputeModeClient(args.compute_mode_socket) if args.compute_mode_socket \
            else backend
        return MpsProvider(MpsLayout(args.mps_root), modes, args.mps_control)
    if name == ProviderName.HAMI_CORE:
        return HamiCoreProvider(args.hami_core_library, args.state_dir)
    return NoIsolation()
