"""``gpupool device-plugin``: the node agent (kubelet device plugin) for one node.

Here: the flags, and what is checked before anything starts (the node name, the
device-list strategy, the GPUs: the fake GPU file or NVML, the kubeconfig);
``device_plugin_run`` then serves.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from gpupool.cli.args import (
    KUBECONFIG_HELP,
    SERVER_HELP,
    add_log_level,
    bounded,
    deprecated_alias,
)
from gpupool.cli.defaults import (
    DEFAULT_CDI_DIR,
    DEFAULT_CDI_KIND,
    DEFAULT_OVERUSE_ACTION,
    DEFAULT_STRATEGY,
    HAMI_CORE_LIBRARY,
    ISOLATION_LABEL,
    OVERUSE_ACTIONS,
    STRATEGIES,
)
from gpupool.cli.gpus import gpu_backend
from gpupool.contract import dra
from gpupool.contract.isolation import ProviderName
from gpupool.contract.slices import PROVIDERS
from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.isolation.mpsdaemon import CONTROL
from gpupool.nodeagent.logical import DEFAULT_MIB_PER_DEVICE

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
    p.add_argument("--device-list-strategy", choices=STRATEGIES,
                   default=DEFAULT_STRATEGY,
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
                        f"(default): the node's label {ISOLATION_LABEL}, else none")
    p.add_argument("--mps-root", type=Path, default=Path("/run/gpupool/mps"), metavar="DIR",
                   help="host directory for the MPS daemons' pipe, log and shm directories "
                        "(default /run/gpupool/mps)")
    p.add_argument("--mps-control", default=CONTROL, metavar="FILE",
                   help=f"the MPS control executable (default {CONTROL})")
    p.add_argument("--compute-mode-socket", type=Path, default=None, metavar="FILE",
                   help="mps: ask `gpupool mps-helper` on this unix socket to set GPU compute "
                        "modes (which needs CAP_SYS_ADMIN); default: set them through NVML "
                        "itself")
    p.add_argument("--hami-core-library", type=Path, default=Path(HAMI_CORE_LIBRARY),
                   metavar="FILE",
                   help=f"HAMi-core's libvgpu.so on the host (default {HAMI_CORE_LIBRARY})")
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
    p.add_argument("--remote-provider", choices=PROVIDERS, default="none",
                   help="the data plane of remote slices (the webhook's): a remote-allowed "
                        "pod here whose slice is served by a slice server gets no device and "
                        "this provider's client settings; none: such a pod is refused "
                        "(default none)")
    p.add_argument("--lupine-client-library", default="", metavar="PATH",
                   help="with --remote-provider lupine: LUPINE's client library in the "
                        "workloads' images, given to such a pod as LD_PRELOAD (default: none)")
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
    p.add_argument("--over-use-action", choices=OVERUSE_ACTIONS,
                   default=DEFAULT_OVERUSE_ACTION,
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
    """Check the node name, the device-list strategy and the GPUs (the fake GPU file, or
    NVML) and reach the cluster, then serve (``device_plugin_run``: the modules serving
    needs load only now)."""
    if not args.node_name:
        raise InvalidInput("--node-name (or $NODE_NAME) is required")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: "
                                                     "%(message)s")
    from gpupool.nodeagent.exposure import Exposure, Strategy

    exposure = Exposure(Strategy(args.device_list_strategy), args.cdi_kind)
    backend = gpu_backend(args.fake_gpus)
    from gpupool.kube.api import DraApi  # the Kubernetes client: once there are GPUs

    api = DraApi.connect(kubeconfig=args.kubeconfig, server=args.server)
    assert isinstance(api, DraApi)  # connect builds ``cls``
    from gpupool.cli.device_plugin_run import serve

    return serve(args, api, backend, exposure)
