"""Strict YAML: every unknown key, wrong type and missing key of a file, with its place.

A *shape* says what a document may hold: ``Map`` (known keys, which are required,
what other keys may be), ``Seq`` (a list of one shape), ``Value`` (scalars of
some kinds), ``OneOf`` (a map or a list, say) and ``ANYTHING``. Shapes are data,
kept beside the loader that reads the file, so a new key is a one-line change.

``check`` walks a composed YAML node tree (PyYAML's ``compose``: nodes with
``id``, ``tag``, ``value`` and ``start_mark``; this module is pure and does not
parse YAML itself) against a shape and returns every ``Problem`` at once::

    pods.yaml:12:7: unknown key 'gpuMemroy' in pods[0].containers[0] (did you mean 'gpuMemory'?)

``check_text`` composes the text with the parser it is handed and turns a
malformed document into the same ``file:line:col`` form. ``YamlProblems`` (an
``InvalidInput``) carries the problems of a file; its message has one line each.
Lines and columns count from 1, as editors do.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.core.errors import InvalidInput

MAX_PROBLEMS = 50
"""More problems than this are counted, not listed (a file of the wrong kind)."""
TYPO_CUTOFF = 0.85
"""How like a known name (difflib's ratio) a key of an open map must be to be taken for
a typo of it: ``gpupool.io/mdoe`` (0.93) is, ``gpupool.io/over-use`` (0.76) is not."""
TAG = "tag:yaml.org,2002:"
KIND_WORDS = {"str": "a string", "int": "a whole number", "float": "a number",
              "bool": "true or false", "null": "nothing (null)", "timestamp": "a date",
              "map": "a map", "list": "a list", "binary": "binary data", "set": "a set"}


class Mark(Protocol):
    line: int
    column: int


class YamlNode(Protocol):
    """A composed YAML node as PyYAML's ``compose`` gives it."""

    id: str  # "scalar", "sequence" or "mapping"
    tag: str
    value: Any
    start_mark: Mark


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a file, at 1-based ``line`` and ``column``."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


class YamlProblems(InvalidInput):
    """A YAML file that does not match its shape: every problem, one line each."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = tuple(problems)
        lines = [str(p) for p in self.problems[:MAX_PROBLEMS]]
        if len(self.problems) > MAX_PROBLEMS:
            lines.append(f"... and {len(self.problems) - MAX_PROBLEMS} more problems")
        super().__init__("\n".join(lines))


# -- shapes ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Value:
    """A scalar of one of ``kinds`` (YAML core schema: str, int, float, bool, null)."""

    kinds: frozenset[str]
    what: str


@dataclass(frozen=True, slots=True)
class Seq:
    """A list whose every item has shape ``item``."""

    item: Shape


@dataclass(frozen=True, slots=True)
class Map:
    """A map with ``fields``; keys named in ``required`` must be there.

    ``others``: the shape of keys not in ``fields`` (None: such keys are unknown),
    except keys starting with one of ``closed`` (a namespace whose every name is in
    ``fields``). ``typos_of``: an other key that closely resembles one of these names
    is taken for a typo of it and reported."""

    fields: Mapping[str, Shape]
    required: frozenset[str] = frozenset()
    others: Shape | None = None
    closed: tuple[str, ...] = ()
    typos_of: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OneOf:
    """The first of ``shapes`` whose kind (map, list, scalar) the node has."""

    shapes: tuple[Shape, ...]


@dataclass(frozen=True, slots=True)
class Anything:
    """Any value; not looked into."""


Shape = Value | Seq | Map | OneOf | Anything
ANYTHING = Anything()
TEXT = Value(frozenset({"str"}), "a string")
WHOLE = Value(frozenset({"int"}), "a whole number")
NUMBER = Value(frozenset({"int", "float"}), "a number")
FLAG = Value(frozenset({"bool"}), "true or false")
SCALAR = Value(frozenset({"str", "int", "float", "bool"}), "a string, number or true/false")
QUANTITY = Value(frozenset({"str", "int", "float"}), "a number or a quantity such as 16Gi")


def strings(*names: str) -> dict[str, Shape]:
    """``{name: ANYTHING}`` for fields whose values are not looked into."""
    return dict.fromkeys(names, ANYTHING)


def closest(name: str, known: Sequence[str], cutoff: float = 0.6) -> str | None:
    """The known name most like ``name`` (difflib's ratio), or None."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return found[0] if found else None


# -- checking ----------------------------------------------------------------------------------
@dataclass(slots=True)
class _Walk:
    file: str
    problems: list[Problem] = field(default_factory=list)
    seen: set[tuple[int, int]] = field(default_factory=set)
    pairs: dict[int, list[tuple[YamlNode, YamlNode]]] = field(default_factory=dict)
    merging: set[int] = field(default_factory=set)  # maps whose merges are being spliced

    def add(self, node: YamlNode, message: str) -> None:
        mark = node.start_mark
        self.problems.append(Problem(self.file, mark.line + 1, mark.column + 1, message))


def check(root: YamlNode | None, file: str, shape: Shape) -> tuple[Problem, ...]:
    """Every problem of the composed document ``root`` against ``shape``, in file order
    (an empty document has none: its loader says what it misses)."""
    walk = _Walk(file)
    if root is not None:
        _node(walk, root, shape, "")
    return tuple(sorted(walk.problems, key=lambda p: (p.line, p.column)))


def check_text(text: str, file: str, shape: Shape, compose: Callable[[str], Any],
               errors: type[Exception] | tuple[type[Exception], ...]) -> None:
    """Compose ``text`` with ``compose`` (raising ``errors`` on malformed YAML, with
    PyYAML's ``problem_mark``) and check it; raise ``YamlProblems`` on any problem."""
    try:
        root = compose(text)
    except errors as exc:
        raise YamlProblems([malformed(file, exc)]) from None
    problems = check(root, file, shape)
    if problems:
        raise YamlProblems(problems)


def malformed(file: str, exc: Exception) -> Problem:
    """A parser's error as a problem at its mark (line 1 when it has none)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    what = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context = " ".join(str(getattr(exc, "context", None) or "").split())
    if context and getattr(exc, "problem", None):
        what = f"{context}, {what}" if what.startswith("but ") else f"{what} ({context})"
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    return Problem(file, line, column, f"not valid YAML: {what}")


def kind_of(node: YamlNode) -> str:
    """``map``, ``list`` or the scalar's resolved kind (``str``, ``int``, ...)."""
    if node.id == "mapping":
        return "map"
    if node.id == "sequence":
        return "list"
    tag = node.tag
    return tag[len(TAG):] if tag.startswith(TAG) else "str"


def _node(walk: _Walk, node: YamlNode, shape: Shape, path: str) -> None:
    if (id(node), id(shape)) in walk.seen:  # an alias met again: checked once
        return
    walk.seen.add((id(node), id(shape)))
    kind = kind_of(node)
    while isinstance(shape, OneOf):
        shape = _pick(shape, kind)
    if isinstance(shape, Anything) or kind == "null":
        return
    if isinstance(shape, Value):
        if kind not in shape.kinds and not (kind == "int" and "float" in shape.kinds):
            walk.add(node, f"{_at(path)}: expected {shape.what}, got {_got(node, kind)}")
    elif isinstance(shape, Seq):
        if kind != "list":
            walk.add(node, f"{_at(path)}: expected a list, got {_got(node, kind)}")
            return
        for i, item in enumerate(node.value):
            _node(walk, item, shape.item, f"{path}[{i}]")
    elif kind != "map":
        walk.add(node, f"{_at(path)}: expected a map, got {_got(node, kind)}")
    else:
        _map(walk, node, shape, path)


def _pick(shape: OneOf, kind: str) -> Shape:
    wants = {"map": Map, "list": Seq}
    for choice in shape.shapes:
        if isinstance(choice, (wants.get(kind, Value), Anything)):
            return choice
    return shape.shapes[0]


def _map(walk: _Walk, node: YamlNode, shape: Map, path: str) -> None:
    first: dict[str, YamlNode] = {}
    for key_node, value in _pairs(walk, node, path):
        key = str(key_node.value)
        if key in first:
            walk.add(key_node, f"key {key!r} appears twice in {_in(path)} (first at line "
                               f"{first[key].start_mark.line + 1})")
            continue
        first[key] = key_node
        child = shape.fields.get(key) or _other(walk, key_node, key, shape, path)
        if child is not None:
            _node(walk, value, child, f"{path}.{key}" if path else key)
    for key in sorted(shape.required - set(first)):
        walk.add(node, f"{_in(path)}: missing required key {key!r}")


def _pairs(walk: _Walk, node: YamlNode, path: str) -> list[tuple[YamlNode, YamlNode]]:
    """The map's key/value nodes, with ``<<`` merge keys' maps spliced in (before the
    map's own keys). YAML's precedence: the map's own keys win, then the maps merged
    earlier; only the own keys can be given twice. Worked out once per map (an anchor
    merged many times costs once); a map that merges itself is a problem, not a loop."""
    done = walk.pairs.get(id(node))
    if done is not None:
        return done
    walk.merging.add(id(node))
    own: list[tuple[YamlNode, YamlNode]] = []
    merged: list[tuple[YamlNode, YamlNode]] = []
    for key_node, value in node.value:
        if key_node.tag == TAG + "merge":
            merged += _merged(walk, value, path)
        else:
            own.append((key_node, value))
    walk.merging.discard(id(node))
    walk.pairs[id(node)] = pairs = _spliced(own, merged)
    return pairs


def _merged(walk: _Walk, value: YamlNode, path: str) -> list[tuple[YamlNode, YamlNode]]:
    out: list[tuple[YamlNode, YamlNode]] = []
    for source in value.value if value.id == "sequence" else [value]:
        if source.id != "mapping":
            continue
        if id(source) in walk.merging:
            walk.add(source, f"{_in(path)} merges itself: a '<<' refers to a map that "
                             "contains it (remove that merge)")
            continue
        out += _pairs(walk, source, path)
    return out


def _spliced(own: list[tuple[YamlNode, YamlNode]], merged: list[tuple[YamlNode, YamlNode]]
             ) -> list[tuple[YamlNode, YamlNode]]:
    taken = {str(k.value) for k, _ in own}
    spliced = []
    for pair in merged:  # the first map merged in gives a key, as YAML merges them
        if str(pair[0].value) not in taken:
            taken.add(str(pair[0].value))
            spliced.append(pair)
    return spliced + own


def _other(walk: _Walk, key_node: YamlNode, key: str, shape: Map, path: str) -> Shape | None:
    if shape.others is not None and not key.startswith(shape.closed):
        near = closest(key, shape.typos_of, TYPO_CUTOFF)
        if near is None:
            return shape.others
    else:
        near = closest(key, sorted(shape.fields))
    hint = f" (did you mean {near!r}?)" if near else _known(shape, key)
    walk.add(key_node, f"unknown key {key!r} in {_in(path)}{hint}")
    return None


def _known(shape: Map, key: str) -> str:
    names = sorted(k for k in shape.fields if k.startswith(shape.closed)
                   ) if key.startswith(shape.closed) and shape.closed else sorted(shape.fields)
    if not names or len(names) > 12:
        return ""
    return f" (known: {', '.join(names)})"


def _at(path: str) -> str:
    return path or "the document"


def _in(path: str) -> str:
    return path or "the top level"


def _got(node: YamlNode, kind: str) -> str:
    if kind in ("map", "list"):
        return KIND_WORDS[kind]
    return f"{KIND_WORDS.get(kind, kind)} {str(node.value)[:40]!r}"
