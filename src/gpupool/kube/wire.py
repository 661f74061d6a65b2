"""``Wire``: the calls of the extender's bind path (the GPULedger read and
compare-and-swap, the Binding) sent on lightkube's own httpx client, without lightkube's
per-call request building.

A write through lightkube builds its path from the resource's description, and httpx
parses that path and the query as text and merges them with the server's URL — three
URL parses a request (in the profile of a write loop, about a fifth of the client's CPU)
—, then lightkube decodes the answer (a Binding's answer is a ``Status``, which lightkube
tries to read as a Binding and fails). ``Wire`` builds the request's URL from the
server's URL parsed once, the body with the same encoder lightkube uses (msgspec), and
reads the answer as a dict or not at all. The request still goes through the same httpx
client: its headers, cookies, timeouts, authentication (a token, a token file read again
after a 401, an exec plugin, a client certificate), the transport (``ApiTransport``: TLS,
keep-alive, ``close``); error answers are read by lightkube's own ``raise_for_status``,
so callers see the same exceptions.

Only names that Kubernetes accepts (DNS-1123 subdomains) take this path: a name that is
not one is sent through lightkube, as before (``url`` answers ``None``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, cast

import httpx2
import lightkube
import msgspec
from lightkube.core.generic_client import GenericSyncClient

# a DNS-1123 subdomain: what Kubernetes accepts as the name of a namespace, pod, node or
# custom object; nothing in it needs escaping in a URL path
log = logging.getLogger(__name__)

_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder().decode
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class Wire:
    """The bind path's requests on one lightkube client's httpx client."""

    def __init__(self, client: lightkube.Client):
        generic = client._client
        assert isinstance(generic, GenericSyncClient)
        # lightkube's reading of an error answer (``ApiError`` for a Status, else httpx's)
        self._raise_for_status = cast(Callable[[httpx2.Response], None],
                                      generic.raise_for_status)
        self._http: httpx2.Client = generic._client
        base = self._http.base_url
        self._base = base._uri_reference  # the server's URL, parsed once
        self._prefix = base.raw_path.decode("ascii")  # ends with "/" (httpx's base_url)
        manager = generic._field_manager
        self._write_query = None if manager is None else \
            str(httpx2.QueryParams({"fieldManager": manager}))
        probe = self.url(("api", "v1", "namespaces"), ("a",), write=False)
        if probe is None or probe != self._http.base_url.join("api/v1/namespaces/a"):
            raise TypeError(f"this httpx builds {probe} where {base}api/v1/namespaces/a "
                            "was meant")

    @classmethod
    def of(cls, client: lightkube.Client) -> Wire | None:
        """``Wire`` on ``client``; None (every call then goes through lightkube) when the
        installed lightkube or httpx is not built as this module reads it (it reads a few
        of their private attributes, as the pinned versions have them)."""
        try:
            return cls(client)
        except (AttributeError, AssertionError, TypeError) as exc:
            log.warning("the bind path's requests go through lightkube's request building: "
                        "this lightkube or httpx differs from the pinned ones (%s)", exc)
            return None

    def url(self, path: tuple[str, ...], names: tuple[str, ...], write: bool
            ) -> httpx2.URL | None:
        """The URL of ``path`` (fixed segments) then ``names`` (checked: ``None`` when one
        is not a DNS-1123 name), with the field manager when ``write``."""
        for name in names:
            if not _NAME.fullmatch(name):
                return None
        url = httpx2.URL.__new__(httpx2.URL)
        url._uri_reference = self._base._replace(
            path=self._prefix + "/".join(path + names),
            query=self._write_query if write else None)
        return url

    def send(self, method: str, url: httpx2.URL, body: Any = None,
             content_type: str = JSON) -> httpx2.Response:
        """One request; an error answer raises as lightkube raises it (``ApiError``, else
        httpx's ``HTTPStatusError``)."""
        if body is None:
            request = self._http.build_request(method, url)
        else:
            request = self._http.build_request(method, url, content=_ENCODE(body),
                                               headers={"Content-Type": content_type})
        response = self._http.send(request)
        self._raise_for_status(response)
        return response

    @staticmethod
    def decoded(response: httpx2.Response) -> dict[str, Any]:
        """The answer's body as a dict (``msgspec.DecodeError`` if it is not JSON,
        ``ValidationError`` if not an object)."""
        obj = _DECODE(response.content)
        if not isinstance(obj, dict):
            raise msgspec.ValidationError(f"expected an object, got {type(obj).__name__}")
        return obj
