"""How deeply a JSON body may nest: ``MAX_DEPTH`` levels of objects and arrays.

gpupool reads the JSON the API server and kube-scheduler send (AdmissionReviews, the
extender's calls). Their decoders recurse once per level and stop at the interpreter's
recursion limit, which is not a property of the body: the same body would be read by one
process and refused by another (a test runner's worker, a thread with another limit), and
a raised limit lets a deep enough body exhaust the C stack. So a body is checked against
``MAX_DEPTH`` before it is decoded, by ``deeper_than``, which reads no more than the
brackets outside strings and never recurses. No Kubernetes object comes near the limit (a
pod's deepest field, through ``managedFields``, is some 20 levels down); the default
recursion limit (1,000) leaves the decoders room for it.
"""

from __future__ import annotations

import itertools
import re

MAX_DEPTH = 512
_PASSES = 8  # innermost pairs taken away this many times before levels are counted
_PIECE = 65536  # brackets counted per step
_STRING = re.compile(rb'"[^"]*"')
_FOLD = bytes.maketrans(b"{}", b"[]")
_NOT_SYNTAX = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_STEP = [0] * 256
_STEP[ord("[")], _STEP[ord("]")] = 1, -1


def deeper_than(body: bytes | bytearray, limit: int = MAX_DEPTH) -> bool:
    """Whether ``body``, read as JSON, nests objects and arrays more than ``limit`` deep
    (brackets never closed count as open; text that is no JSON may be counted a few
    levels deeper than its decoder would go before failing)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # too few brackets to nest that deep: the common case, two counts
    brackets = _brackets(body)
    removed = 0
    while removed < _PASSES and b"[]" in brackets:  # each pass: one level less
        brackets, removed = brackets.replace(b"[]", b""), removed + 1
    return _deepest(brackets, limit - removed) > limit - removed


def _brackets(body: bytes | bytearray) -> bytes:
    """The brackets of ``body`` outside strings, ``{}`` written as ``[]``."""
    unescaped = bytes(body).replace(b"\\\\", b"").replace(b'\\"', b"")  # left to right
    syntax = unescaped.translate(_FOLD, _NOT_SYNTAX)  # brackets and quotes
    # '""' is an empty string or two strings with no bracket between: either way none
    return _STRING.sub(b"", syntax.replace(b'""', b""))


def _deepest(brackets: bytes, enough: int) -> int:
    """The most brackets open at once, counted until it passes ``enough``."""
    level = deepest = 0
    for at in range(0, len(brackets), _PIECE):
        levels = list(itertools.accumulate(map(_STEP.__getitem__, brackets[at:at + _PIECE]),
                                           initial=level))
        deepest, level = max(deepest, max(levels)), levels[-1]
        if deepest > enough:
            break
    return deepest
