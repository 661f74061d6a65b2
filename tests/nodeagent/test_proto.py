"""The committed gRPC modules are what generate.sh makes from the .proto files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import gpupool.nodeagent.proto as proto_pkg
from gpupool.nodeagent.proto import deviceplugin_pb2, deviceplugin_pb2_grpc

PROTO = Path(proto_pkg.__file__).parent


def test_regenerating_gives_the_committed_files(tmp_path: Path) -> None:
    target = tmp_path / "gpupool" / "nodeagent" / "proto"
    target.mkdir(parents=True)
    for f in [*PROTO.glob("*.proto"), PROTO / "generate.sh"]:
        shutil.copy(f, target / f.name)
    subprocess.run(["sh", str(target / "generate.sh")], check=True,
                   env={**os.environ, "PYTHON": sys.executable})
    generated = sorted(p.name for p in target.glob("*_pb2*.py"))
    assert generated == sorted(p.name for p in PROTO.glob("*_pb2*.py"))
    for name in generated:
        assert (target / name).read_text() == (PROTO / name).read_text(), name


def test_wire_names_and_field_numbers_match_v1beta1() -> None:
    d = deviceplugin_pb2.DESCRIPTOR
    assert d.package == "v1beta1"
    assert [m.name for m in d.services_by_name["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
        "PreStartContainer"]
    numbers = {f.name: f.number for f in d.message_types_by_name[
        "ContainerAllocateResponse"].fields}
    assert numbers == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    reg = {f.name: f.number for f in d.message_types_by_name["RegisterRequest"].fields}
    assert reg == {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}
    assert hasattr(deviceplugin_pb2_grpc, "RegistrationStub")
