"""The shapes of the calls ``KubeApi`` makes on the lean transport: a list (page after
page), a watch (one event per line), one object (a get or a write), and the URL path of
a resource kind. They decode with lightkube's own msgspec decoders, so both paths
give the same models; failures raise the ``gpupool.kube.errors`` tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

import msgspec
from lightkube.core import resource as lk_resource
from lightkube.core.decoders import decode_list, decode_object, decode_watch_event
from lightkube.core.selector import build_selector

from gpupool.kube.errors import KubeError
from gpupool.kube.transport import JSON, LeanTransport, status_error

T = TypeVar("T")
_DECODE = msgspec.json.Decoder().decode


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    """The objects of a list call and the resourceVersion to watch from."""

    items: list[T]
    resource_version: str


def path_of(res: Any) -> str:
    """The URL path of ``res``'s objects in every namespace."""
    info = lk_resource.api_info(res)
    base = info.resource
    root = f"/api/{base.version}" if not base.group else f"/apis/{base.group}/{base.version}"
    return f"{root}/{info.plural}"


def _selectors(labels: Mapping[str, Any] | None, fields: Mapping[str, Any] | None
               ) -> dict[str, Any]:
    return {"labelSelector": build_selector(dict(labels)) if labels else None,
            "fieldSelector": build_selector(dict(fields), for_fields=True) if fields
            else None}


def list_objects(transport: LeanTransport, res: Any, what: str,
                 labels: Mapping[str, Any] | None, fields: Mapping[str, Any] | None
                 ) -> Listing[Any]:
    """Every object of ``res`` in every namespace, page after page while the server
    hands out a ``continue`` token (the list lightkube would make, read without
    httpx: a rebuild lists tens of MB)."""
    params = _selectors(labels, fields)
    items: list[Any] = []
    version, token = "", None
    while True:
        query = urlencode({k: v for k, v in {**params, "continue": token}.items() if v})
        data = transport.request("GET", f"{path_of(res)}?{query}" if query else path_of(res),
                                 what)
        try:
            token, page_version, page = decode_list(data, res)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise KubeError(f"{what}: the answer is not a list ({exc})") from None
        items.extend(page)
        version = version or page_version or ""
        if not token:
            return Listing(items, version)


def watch_objects(transport: LeanTransport, res: Any, what: str, resource_version: str,
                  timeout_s: int | None, labels: Mapping[str, Any] | None,
                  fields: Mapping[str, Any] | None) -> Iterator[tuple[str, Any]]:
    """(event type, object) for each event of the watch, until the server ends it."""
    params = {"watch": "true", "resourceVersion": resource_version or None,
              "timeoutSeconds": timeout_s, **_selectors(labels, fields)}
    query = urlencode({k: v for k, v in params.items() if v is not None})
    for line in transport.stream(f"{path_of(res)}?{query}", what, timeout_s):
        try:
            event = decode_watch_event(line)
            if event.type == "ERROR":
                raise status_error(bytes(event.object), what)
            obj = decode_object(event.object, res)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise KubeError(f"{what}: an event that is not a watch event ({exc})") from None
        yield event.type, obj


def object_call(transport: LeanTransport, method: str, path: str, what: str,
                body: bytes | None = None, content_type: str = JSON) -> dict[str, Any]:
    """One object's call (a get, a create, a patch): the answer as a dict."""
    data = transport.request(method, path, what, body, content_type)
    try:
        obj = _DECODE(data)
    except msgspec.DecodeError as exc:
        raise KubeError(f"{what}: the answer is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise KubeError(f"{what}: the answer is not an object")
    return obj
