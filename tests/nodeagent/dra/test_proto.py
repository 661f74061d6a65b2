"""The DRA and registration protos speak kubelet's wire names and field numbers."""

from __future__ import annotations

from gpupool.nodeagent.proto import dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_pb2


def fields(module: object, message: str) -> dict[str, int]:
    d = module.DESCRIPTOR  # type: ignore[attr-defined]
    return {f.name: f.number for f in d.message_types_by_name[message].fields}


def test_dra_services_are_named_as_kubelet_calls_them() -> None:
    for module, version in ((dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        assert [m.name for m in service.methods] == ["NodePrepareResources",
                                                     "NodeUnprepareResources"]
        assert fields(module, "Claim") == {"namespace": 1, "uid": 2, "name": 3}
        assert fields(module, "Device") == {"request_names": 1, "pool_name": 2,
                                            "device_name": 3, "cdi_device_ids": 4}
        assert fields(module, "NodePrepareResourceResponse") == {"devices": 1, "error": 2}
        assert fields(module, "NodeUnprepareResourceResponse") == {"error": 1}


def test_registration_is_the_plugin_watchers_service() -> None:
    d = pluginregistration_pb2.DESCRIPTOR
    assert d.services_by_name["Registration"].full_name == "pluginregistration.Registration"
    assert fields(pluginregistration_pb2, "PluginInfo") == {
        "type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert fields(pluginregistration_pb2, "RegistrationStatus") == {
        "plugin_registered": 1, "error": 2}
