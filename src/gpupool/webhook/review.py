"""AdmissionReview v1 in and out: the wire format the API server speaks to webhooks.

``read_review`` turns a request body into a ``Request`` (or raises ``BadReview``
saying what is wrong — also for JSON nested more than ``jsondepth.MAX_DEPTH`` levels or a
number too long to read —
which the server answers with a denial to ``uid_of(body)``, or with HTTP 400 where no
``request.uid`` can be read: there is nothing to answer to). ``answer`` turns a ``Verdict`` into
the AdmissionReview response body: ``allowed``, a ``status`` with the message a
person reads in ``kubectl``'s error, ``warnings``, and a JSONPatch (base64) for
mutations. Pure: no I/O.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.contract import jsondepth
from gpupool.core.errors import InvalidInput

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
MAX_MESSAGE_CHARS = 4000
MAX_WARNINGS = 10
MAX_WARNING_CHARS = 480  # the API server drops warnings longer than this (in runes)
MAX_DIGITS = 4300
"""The longest integer a body may hold: Python's own limit for reading one (no Kubernetes
field comes near: an int64 has 19 digits)."""

Obj = dict[str, Any]


class BadReview(InvalidInput):
    """A body that is no AdmissionReview v1 request; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Request:
    """What an AdmissionReview asks about (``obj``/``old``: None where the API sent none)."""

    uid: str
    resource: str  # "pods", "resourceclasses", ...
    sub_resource: str  # "", "status", "binding", "ephemeralcontainers"
    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    namespace: str
    name: str
    username: str
    groups: tuple[str, ...]
    extra: Mapping[str, tuple[str, ...]]
    obj: Mapping[str, Any] | None
    old: Mapping[str, Any] | None
    dry_run: bool = False

    @property
    def what(self) -> str:
        return f"{self.resource}/{self.sub_resource}" if self.sub_resource else self.resource


@dataclass(frozen=True, slots=True)
class Verdict:
    """The webhook's answer: allowed or not, why, and the patch of a mutation."""

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    patch: tuple[Obj, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    @staticmethod
    def allow(patch: Sequence[Obj] = (), warnings: Sequence[str] = ()) -> Verdict:
        return Verdict(True, patch=tuple(patch), warnings=tuple(warnings))

    @staticmethod
    def deny(message: str, code: int = 403, reason: str = "Forbidden") -> Verdict:
        return Verdict(False, message, code, reason)

    @property
    def outcome(self) -> str:
        """``allowed``, ``patched`` or ``denied`` (a metric label)."""
        if not self.allowed:
            return "denied"
        return "patched" if self.patch else "allowed"


def _map(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadReview(f"{what} must be a JSON object")
    return value


def _text(body: Mapping[str, Any], key: str, what: str, required: bool = False) -> str:
    value = body.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise BadReview(f"{what}.{key} must be a {'non-empty ' if required else ''}string")
    return value


def _object(value: Any, what: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    return _map(value, what)


def _extra(value: Any) -> dict[str, tuple[str, ...]]:
    if value is None:
        return {}
    extra = _map(value, "request.userInfo.extra")
    out: dict[str, tuple[str, ...]] = {}
    for key, values in extra.items():
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise BadReview(f"request.userInfo.extra[{key!r}] must be a list of strings")
        out[str(key)] = tuple(values)
    return out


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise BadReview(f"the body holds a number of more than {MAX_DIGITS} digits")
    return int(text)


def _json(body: bytes, integer: Callable[[str], object]) -> Any:
    """``body`` read as JSON; ``BadReview`` for what is no JSON or cannot be read (nested
    more than ``jsondepth.MAX_DEPTH`` levels: checked before reading, so the answer never
    depends on the interpreter's recursion limit)."""
    too_deep = BadReview(f"the body is not JSON that can be read: it is nested too deeply "
                         f"(more than {jsondepth.MAX_DEPTH} levels; no Kubernetes object "
                         "comes near)")
    if jsondepth.deeper_than(body):
        raise too_deep
    try:
        return json.loads(body, parse_int=integer)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadReview(f"the body is not JSON ({exc})") from None
    except RecursionError:  # a recursion limit set below MAX_DEPTH: refused all the same
        raise too_deep from None


def read_review(body: bytes) -> Request:
    """The ``Request`` of an AdmissionReview v1 body; ``BadReview`` says what is wrong."""
    review = _json(body, _integer)
    review = _map(review, "the body")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != KIND:
        raise BadReview(f"the body is not an {API_VERSION} {KIND} (got apiVersion "
                        f"{review.get('apiVersion')!r}, kind {review.get('kind')!r}); list "
                        "only v1 in the webhook's admissionReviewVersions")
    req = _map(review.get("request"), "request")
    resource = _map(req.get("resource"), "request.resource")
    user = _map(req.get("userInfo") or {}, "request.userInfo")
    groups = user.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise BadReview("request.userInfo.groups must be a list of strings")
    return Request(
        uid=_text(req, "uid", "request", required=True),
        resource=_text(resource, "resource", "request.resource", required=True),
        sub_resource=_text(req, "subResource", "request"),
        operation=_text(req, "operation", "request", required=True),
        namespace=_text(req, "namespace", "request"),
        name=_text(req, "name", "request"),
        username=_text(user, "username", "request.userInfo"),
        groups=tuple(groups),
        extra=_extra(user.get("extra")),
        obj=_object(req.get("object"), "request.object"),
        old=_object(req.get("oldObject"), "request.oldObject"),
        dry_run=req.get("dryRun") is True)


def uid_of(body: bytes) -> str:
    """The request uid of a body ``read_review`` refused, when one can be read (else ""):
    numbers are skipped, so a number too long to read still leaves the uid readable."""
    try:
        uid = _json(body, lambda _: 0)["request"]["uid"]
    except (BadReview, TypeError, KeyError):
        return ""
    return uid if isinstance(uid, str) else ""


def answer(uid: str, verdict: Verdict) -> Obj:
    """The AdmissionReview v1 response body for ``verdict``."""
    response: Obj = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": verdict.code, "reason": verdict.reason,
                              "message": verdict.message[:MAX_MESSAGE_CHARS]}
    if verdict.patch:
        raw = json.dumps(list(verdict.patch), separators=(",", ":")).encode()
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(raw).decode()
    if verdict.warnings:
        response["warnings"] = [w[:MAX_WARNING_CHARS] for w in verdict.warnings[:MAX_WARNINGS]]
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) to ``parts``: ``~`` and ``/`` escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
