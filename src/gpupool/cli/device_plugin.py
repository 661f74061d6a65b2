"""``gpupool device-plugin``: the node agent (kubelet device plugin) for one node."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from gpupool.cli.args import (
    KUBECONFIG_HELP,
    SERVER_HELP,
    add_log_level,
    bounded,
    deprecated_alias,
)
from gpupool.contract import dra
from gpupool.contract.isolation import ProviderName
from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.kube.api import DraApi, KubeApi
from gpupool.kube.errors import NotFound
from gpupool.kube.keystore import PUBLIC_CONFIG_MAP, KeyRingSource
from gpupool.nodeagent.actions import OveruseAction
from gpupool.nodeagent.agent import AgentConfig, Guards, NodeAgent
from gpupool.nodeagent.dra.cdi import DEFAULT_CDI_DIR
from gpupool.nodeagent.dra.claimsource import KubeDraCluster
from gpupool.nodeagent.dra.plugin import DraAgent, DraConfig
from gpupool.nodeagent.dra.pods import ClaimPods
from gpupool.nodeagent.dra.versions import nvml_versions
from gpupool.nodeagent.dra.watch import DraGuards
from gpupool.nodeagent.exposure import DEFAULT_CDI_KIND, Exposure, Strategy
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.fakemig import FakeMigDriver
from gpupool.nodeagent.freezer import Freezer
from gpupool.nodeagent.gpu import GpuBackend
from gpupool.nodeagent.isolation.computemode import ComputeModeClient
from gpupool.nodeagent.isolation.hamicore import DEFAULT_LIBRARY, HamiCoreProvider
from gpupool.nodeagent.isolation.mps import MpsProvider
from gpupool.nodeagent.isolation.mpsdaemon import CONTROL, MpsLayout
from gpupool.nodeagent.isolation.none import NoIsolation
from gpupool.nodeagent.isolation.provider import NODE_LABEL, IsolationProvider
from gpupool.nodeagent.kubeview import KubeEvents, KubeEvictions, KubeInventory, KubePods
from gpupool.nodeagent.logical import DEFAULT_MIB_PER_DEVICE, Split
from gpupool.nodeagent.metrics import NodeMetrics, serve
from gpupool.nodeagent.mig import MigDriver
from gpupool.nodeagent.monitor import MonitorConfig
from gpupool.nodeagent.nvml import NvmlGpuBackend
from gpupool.nodeagent.nvmlmig import NvmlMigDriver
from gpupool.nodeagent.overuse import OveruseConfig
from gpupool.nodeagent.verify import MEMO_LIMIT, Verifier

log = logging.getLogger(__name__)
AUTO = "auto"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "device-plugin", help="run the node agent (kubelet device plugin or DRA driver)",
        description="Advertise this node's GPUs to kubelet as gpupool.io/gpu logical devices, "
                    "publish GPUDevice objects and serve Allocate from the extender's signed "
                    "decisions; enforce slices through an isolation provider and watch what "
                    "containers really use.")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""), metavar="NODE",
                   help="this node's name (default: $NODE_NAME)")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE") or "gpupool-system",
                   metavar="NAMESPACE",
                   help="gpupool's namespace, where the ConfigMap of decision keys is "
                        "(default: $POD_NAMESPACE, else gpupool-system)")
    p.add_argument("--kubeconfig", default=None, metavar="FILE", help=KUBECONFIG_HELP)
    p.add_argument("--server", default=None, metavar="URL", help=SERVER_HELP)
    deprecated_alias(p, "--api-server", "--server")
    p.add_argument("--kubelet-dir", type=Path, default=Path("/var/lib/kubelet"), metavar="DIR",
                   help="kubelet's directory, with device-plugins/ and pod-resources/ inside "
                        "(default /var/lib/kubelet)")
    p.add_argument("--fake-gpus", type=Path, default=None, metavar="FILE",
                   help="read FAKE GPUs from a YAML file instead of NVML, for machines "
                        "without GPUs (format: docs/fake-gpus.md)")
    p.add_argument("--split", type=bounded(int, 0), default=0, metavar="N",
                   help="logical devices per GPU (default: one per --mib-per-device)")
    p.add_argument("--mib-per-device", type=bounded(int, 1), default=DEFAULT_MIB_PER_DEVICE,
                   metavar="MIB",
                   help=f"GPU memory per logical device (default {DEFAULT_MIB_PER_DEVICE})")
    p.add_argument("--memory-unit", type=bounded(int, 1), default=256, metavar="MIB",
                   help="GPU memory accounting unit in MiB, as the extender's (default 256)")
    deprecated_alias(p, "--memory-unit-mib", "--memory-unit")
    p.add_argument("--heartbeat-seconds", type=bounded(float, 0, above=True), default=30.0,
                   metavar="SECONDS", help="how often GPUDevice status is refreshed (default 30)")
    p.add_argument("--decide-unscheduled", action="store_true",
                   help="decide for pods that carry no decision (clusters WITHOUT the gpupool "
                        "extender). Unsafe against hostile tenants: decisions are then not "
                        "verified, so any pod may claim any slice")
    _exposure_flags(p)
    _isolation_flags(p)
    _monitor_flags(p)
    _mode_flags(p)
    add_log_level(p)
    p.set_defaults(func=run)


def _exposure_flags(p: Any) -> None:
    p.add_argument("--device-list-strategy", choices=[s.value for s in Strategy],
                   default=Strategy.VOLUME_MOUNTS.value,
                   help="how containers are told their GPUs: volume-mounts (default) or cdi, "
                        "which a pod's environment cannot widen; envvar (NVIDIA_VISIBLE_DEVICES"
                        ", which a pod can override) only where neither works")
    p.add_argument("--cdi-kind", default=DEFAULT_CDI_KIND, metavar="KIND",
                   help=f"CDI device kind for --device-list-strategy cdi (default "
                        f"{DEFAULT_CDI_KIND})")


def _mode_flags(p: Any) -> None:
    p.add_argument("--mode", default=AUTO, choices=[AUTO, dra.MODE_DEVICE_PLUGIN, dra.MODE_DRA],
                   help=f"which kubelet API this node is served through: device-plugin "
                        f"(gpupool.io/gpu) or dra (DRA driver {dra.DRIVER}: ResourceSlices and "
                        f"ResourceClaims); auto (default): the node's label "
                        f"{dra.NODE_MODE_LABEL}, else device-plugin")
    p.add_argument("--cdi-dir", type=Path, default=DEFAULT_CDI_DIR, metavar="DIR",
                   help=f"where the DRA mode writes the CDI specs of prepared claims (a "
                        f"directory the container runtime reads; default {DEFAULT_CDI_DIR})")
    p.add_argument("--slice-resync-seconds", type=bounded(float, 1), default=60.0,
                   metavar="SECONDS",
                   help="DRA mode: compare the node's ResourceSlice with the API server's at "
                        "least this often (default 60; GPU changes are written at once)")


def _isolation_flags(p: Any) -> None:
    p.add_argument("--isolation-provider", default=AUTO,
                   choices=[AUTO, *(n.value for n in ProviderName)],
                   help=f"what enforces slices: mps, hami-core, or none (advisory); auto "
                        f"(default): the node's label {NODE_LABEL}, else none")
    p.add_argument("--mps-root", type=Path, default=Path("/run/gpupool/mps"), metavar="DIR",
                   help="host directory for the MPS daemons' pipe, log and shm directories "
                        "(default /run/gpupool/mps)")
    p.add_argument("--mps-control", default=CONTROL, metavar="FILE",
                   help=f"the MPS control executable (default {CONTROL})")
    p.add_argument("--compute-mode-socket", type=Path, default=None, metavar="FILE",
                   help="mps: ask `gpupool mps-helper` on this unix socket to set GPU compute "
                        "modes (which needs CAP_SYS_ADMIN); default: set them through NVML "
                        "itself")
    p.add_argument("--hami-core-library", type=Path, default=Path(DEFAULT_LIBRARY), metavar="FILE",
                   help=f"HAMi-core's libvgpu.so on the host (default {DEFAULT_LIBRARY})")
    p.add_argument("--state-dir", type=Path, default=Path("/var/lib/gpupool"), metavar="DIR",
                   help="host directory for the agent's files mounted into containers "
                        "(default /var/lib/gpupool)")


def _monitor_flags(p: Any) -> None:
    p.add_argument("--proc-root", type=Path, default=Path("/proc"), metavar="DIR",
                   help="the host's /proc (process -> cgroup -> pod; default /proc)")
    p.add_argument("--monitor-seconds", type=bounded(float, 0, above=True), default=10.0,
                   metavar="SECONDS", help="usage sample period (default 10)")
    p.add_argument("--slice-namespace", default="gpupool-slices", metavar="NAMESPACE",
                   help="the namespace of remote slices' servers: the usage of those on this "
                        "node is monitored as the workloads' (docs/remote.md; empty: not "
                        "read; default gpupool-slices)")
    p.add_argument("--grace-seconds", type=bounded(float, 0), default=30.0, metavar="SECONDS",
                   help="how long a container may exceed its slice before it is an "
                        "over-user (default 30)")
    p.add_argument("--compute-window-seconds", type=bounded(float, 0, above=True),
                   default=60.0, metavar="SECONDS",
                   help="window of the compute share comparison (default 60)")
    p.add_argument("--memory-tolerance-mib", type=bounded(int, 0), default=0, metavar="MIB",
                   help="GPU memory above the slice still tolerated (default 0)")
    p.add_argument("--compute-tolerance-pct", type=bounded(int, 0, 100), default=10,
                   metavar="PCT",
                   help="compute points (percent of a GPU) above the share still tolerated "
                        "(default 10)")
    p.add_argument("--over-use-action", choices=[a.value for a in OveruseAction],
                   default=OveruseAction.WARN.value,
                   help="what to do about an over-user besides Event, annotation and metric: "
                        "warn (default), isolate (its GPU takes no new slices), evict, pause "
                        "(its container frozen while it over-uses: cgroup v2 freezer)")
    p.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"), metavar="DIR",
                   help="the host's cgroup v2 hierarchy, written to pause over-users "
                        "(--over-use-action pause; default /sys/fs/cgroup)")
    p.add_argument("--mig-on-demand", action="store_true",
                   help="make the MIG layouts the controller asks on this node's GPUDevices "
                        "(annotation gpupool.io/mig-layout) through NVML; never destroys a MIG "
                        "device a pod or process uses (off by default; NVML needs "
                        "CAP_SYS_ADMIN for it; docs/node-agent.md)")
    p.add_argument("--mig-interval-seconds", type=bounded(float, 0, 86_400), default=300.0,
                   metavar="SECONDS",
                   help="with --mig-on-demand: at most one MIG change on this node this often "
                        "(default 300)")
    p.add_argument("--metrics-port", type=bounded(int, 0, 65535), default=9400, metavar="PORT",
                   help="Prometheus /metrics port (0: off; default 9400)")
    p.add_argument("--metrics-address", default="0.0.0.0", metavar="ADDRESS",
                   help="address /metrics listens on (default 0.0.0.0)")


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        raise InvalidInput("--node-name (or $NODE_NAME) is required")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: "
                                                     "%(message)s")
    config = AgentConfig(args.node_name, args.kubelet_dir,
                         Split(args.split, args.mib_per_device), args.memory_unit,
                         args.heartbeat_seconds, decide_unscheduled=args.decide_unscheduled,
                         monitor_s=args.monitor_seconds, proc_root=args.proc_root,
                         mig_interval_s=args.mig_interval_seconds,
                         slice_namespace=args.slice_namespace)
    exposure = Exposure(Strategy(args.device_list_strategy), args.cdi_kind)
    backend: GpuBackend = (FakeGpuBackend(args.fake_gpus) if args.fake_gpus
                           else NvmlGpuBackend())
    api = DraApi.connect(kubeconfig=args.kubeconfig, server=args.server)
    assert isinstance(api, DraApi)  # connect builds ``cls``
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
    server = serve(metrics, args.metrics_address, args.metrics_port) \
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
    server = serve(guards.metrics, args.metrics_address, args.metrics_port) \
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
