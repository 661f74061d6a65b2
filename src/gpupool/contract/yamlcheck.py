"""Strict YAML: every unknown key, wrong type and missing key of a file, with its place.

A *shape* says what a document may hold: ``Map`` (known keys, which are required,
what other keys may be), ``Seq`` (a list of one shape), ``Value`` (scalars of
some kinds), ``OneOf`` (a map or a list, say) and ``ANYTHING``. Shapes are data,
kept beside the loader that reads the file, so a new key is a one-line change.

``load_text`` reads a file's text with the YAML loader it is handed (PyYAML's
``SafeLoader``: this module is pure and does not parse YAML itself), checks the node
tree against a shape and returns the document that loader constructed *from that same
tree*, or raises every ``Problem`` at once::

    pods.yaml:12:7: unknown key 'gpuMemroy' in pods[0].containers[0] (did you mean 'gpuMemory'?)

What is checked is what is loaded: merge keys (``<<``) are resolved by the loader
itself, so whichever merged map's value a PyYAML release keeps for a key is the value
checked (PyYAML 6.0.4 changed that order). A malformed document becomes one problem in
the same ``file:line:col`` form. ``YamlProblems`` (an ``InvalidInput``) carries the
problems of a file; its message has one line each. Lines and columns count from 1, as
editors do.
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


class YamlReader(Protocol):
    """One document's loader, as ``yaml.SafeLoader(text)`` is."""

    def get_single_node(self) -> Any: ...

    def construct_document(self, node: Any) -> Any: ...

    def dispose(self) -> None: ...


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
    own: dict[int, frozenset[int]] | None = None  # each map's own key nodes (before merges)

    def add(self, node: YamlNode, message: str) -> None:
        mark = node.start_mark
        self.problems.append(Problem(self.file, mark.line + 1, mark.column + 1, message))


def check(root: YamlNode | None, file: str, shape: Shape,
          own: dict[int, frozenset[int]] | None = None) -> tuple[Problem, ...]:
    """Every problem of the document ``root`` against ``shape``, in file order (an empty
    document has none: its loader says what it misses). ``root`` is a tree its loader
    has constructed (merge keys resolved in place); ``own`` names each map's own key
    nodes, taken before that (only those can be given twice)."""
    walk = _Walk(file, own=own)
    if root is not None:
        _node(walk, root, shape, "")
    return tuple(sorted(walk.problems, key=lambda p: (p.line, p.column)))


def load_text(text: str, file: str, shape: Shape, loader: Callable[[str], YamlReader],
              errors: type[Exception] | tuple[type[Exception], ...]) -> Any:
    """The document in ``text`` as ``loader`` (e.g. ``yaml.SafeLoader``) constructs it,
    checked against ``shape``; raise ``YamlProblems`` on any problem, including
    malformed YAML (``errors``, with PyYAML's ``problem_mark``). Merge keys are resolved
    by the loader, and the tree is checked after that, so the values checked are the
    values returned."""
    reader = loader(text)
    try:
        try:
            root = reader.get_single_node()
        except errors as exc:
            raise YamlProblems([malformed(file, exc)]) from None
        if root is None:
            return None
        own, rings = _survey(root, file)
        if rings:
            raise YamlProblems(rings)
        try:
            doc = reader.construct_document(root)
        except errors as exc:
            raise YamlProblems([malformed(file, exc)]) from None
        except RecursionError:
            raise YamlProblems([Problem(file, 1, 1, "not valid YAML: nested too deeply")]
                               ) from None
        problems = check(root, file, shape, own)
        if problems:
            raise YamlProblems(problems)
        return doc
    finally:
        reader.dispose()


def _survey(root: YamlNode, file: str) -> tuple[dict[int, frozenset[int]], list[Problem]]:
    """Each map's own key nodes (its keys other than ``<<``), and a problem for every map
    that merges itself (through any chain of ``<<``), before the loader resolves them."""
    own: dict[int, frozenset[int]] = {}
    sources: dict[int, list[YamlNode]] = {}
    maps: list[YamlNode] = []
    stack, seen = [root], {id(root)}
    while stack:
        node = stack.pop()
        children: list[YamlNode] = []
        if node.id == "sequence":
            children = list(node.value)
        elif node.id == "mapping":
            maps.append(node)
            keys, merged = [], []
            for key_node, value in node.value:
                children += [key_node, value]
                if key_node.tag == TAG + "merge":
                    merged += [m for m in (value.value if value.id == "sequence" else [value])
                               if m.id == "mapping"]
                else:
                    keys.append(id(key_node))
            own[id(node)], sources[id(node)] = frozenset(keys), merged
        for child in children:
            if id(child) not in seen:
                seen.add(id(child))
                stack.append(child)
    return own, _rings(maps, sources, file)


def _rings(maps: list[YamlNode], sources: dict[int, list[YamlNode]], file: str
           ) -> list[Problem]:
    """A problem at each map merged while it is itself being merged (a cycle of ``<<``)."""
    problems: list[Problem] = []
    state: dict[int, int] = {}  # 1: being walked, 2: done
    for start in maps:
        if id(start) in state:
            continue
        state[id(start)] = 1
        path: list[tuple[YamlNode, int]] = [(start, 0)]
        while path:
            node, i = path[-1]
            merged = sources.get(id(node), [])
            if i == len(merged):
                state[id(node)] = 2
                path.pop()
                continue
            path[-1] = (node, i + 1)
            source = merged[i]
            if state.get(id(source)) == 1:
                mark = source.start_mark
                problems.append(Problem(file, mark.line + 1, mark.column + 1,
                                        "this map merges itself: a '<<' refers to a map that "
                                        "contains it (remove that merge)"))
            elif id(source) not in state:
                state[id(source)] = 1
                path.append((source, 0))
    return problems


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
        first.setdefault(key, key_node)
        child = shape.fields.get(key) or _other(walk, key_node, key, shape, path)
        if child is not None:
            _node(walk, value, child, f"{path}.{key}" if path else key)
    for key in sorted(shape.required - set(first)):
        walk.add(node, f"{_in(path)}: missing required key {key!r}")


def _pairs(walk: _Walk, node: YamlNode, path: str) -> list[tuple[YamlNode, YamlNode]]:
    """The pair that gives each key its loaded value, in file order. The loader has put
    merged maps' pairs before the map's own and keeps the last pair of a key, as a dict
    does; a key given twice among the map's own keys is a problem (the first is
    checked)."""
    own = walk.own.get(id(node), frozenset()) if walk.own is not None else None
    given: dict[str, YamlNode] = {}
    last: dict[tuple[str, str], tuple[YamlNode, YamlNode]] = {}
    seen: set[int] = set()
    for key_node, value in node.value:
        if id(key_node) in seen:  # a map merged into itself lists its pairs twice
            continue
        seen.add(id(key_node))
        key = str(key_node.value)
        if own is None or id(key_node) in own:
            if key in given:
                walk.add(key_node, f"key {key!r} appears twice in {_in(path)} (first at "
                                   f"line {given[key].start_mark.line + 1})")
                continue
            given[key] = key_node
        last[(key_node.tag, key)] = (key_node, value)
    return sorted(last.values(), key=lambda p: (p[0].start_mark.line, p[0].start_mark.column))


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
