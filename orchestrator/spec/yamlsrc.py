"""Load YAML into a small tree that remembers the 1-based line of every key, value and item.

PyYAML composes the document into nodes that carry their position; this module turns those
nodes into `Map`, `Seq` and `Scalar` values. Every problem, whatever the input bytes, leaves
as a `SpecError` naming the file and line: bad syntax, tabs, text that is not UTF-8, unknown
tags, duplicate keys, recursive aliases, aliases that repeat too much.

Aliases are counted as the document is composed: each one adds the size (in nodes) of what it
repeats, and past `MAX_ALIAS_NODES` the document is refused at the alias that crossed the
limit. Without that, 48 KB that repeat a list of 5,000 labels on 400 nodes become 2 million
values (5 s and 320 MB) for whatever walks the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import yaml

from orchestrator.errors import SpecError

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TAG_HINT = "distrun reads plain YAML: remove the '!' tag"
_SYNTAX_HINT = "check the indentation, quotes and brackets on this line and the one before"
# An inventory of 1,000 nodes that each merge a 20-key `defaults` anchor and alias a list of
# 10 labels repeats about 50,000 nodes; twice that is still a few MB to walk.
MAX_ALIAS_NODES = 100_000


@dataclass(frozen=True)
class Scalar:
    """A scalar: `value` as YAML reads it (None, bool, int, float, str, date, ...) and
    `text` as written in the file (the unquoted content for a quoted scalar)."""

    value: object
    text: str
    line: int


@dataclass(frozen=True)
class Seq:
    """A sequence and the line where it starts."""

    items: tuple[Node, ...]
    line: int


@dataclass(frozen=True)
class Map:
    """A mapping in file order, the line of each key, and the line where it starts."""

    entries: dict[str, Node]
    key_lines: dict[str, int]
    line: int


Node: TypeAlias = Scalar | Seq | Map


def join_path(path: str, key: str) -> str:
    """Append a mapping key to a key path: `nodes[1]` + `env` -> `nodes[1].env`. A key with
    line breaks or control characters is quoted, so that a message stays on one line.

    Args:
        path: The key path so far; empty at the top level.
        key: The mapping key to append.

    Returns:
        The longer key path.
    """
    key = shown(key)
    return f"{path}.{key}" if path else key


def shown(text: str) -> str:
    """Text for a one-line message: as is when printable, else quoted with escapes.

    Args:
        text: Text taken from a file.

    Returns:
        Text without line breaks or control characters.
    """
    return text if text.isprintable() else repr(text)


def load_yaml(data: str | bytes, file: str) -> Node | None:
    """Parse one YAML document, keeping line numbers.

    Args:
        data: The document, as text or as UTF-8 bytes.
        file: The file name shown in errors.

    Returns:
        The document's root node, or None when the document is empty or only comments.

    Raises:
        SpecError: The text is not valid YAML, not UTF-8, has duplicate keys, non-text keys,
            unsupported tags or a recursive alias.
    """
    text = _decode(data, file) if isinstance(data, bytes) else data
    try:
        root = _compose(text, file)
        return None if root is None else _Builder(file).build(root, "")
    except RecursionError:
        raise _invalid(file, 1, "the document is nested too deeply") from None


def collect_lines(node: Node, path: str = "") -> dict[str, int]:
    """Map every key path under `node` to its line: keys by the key's line, items by theirs.

    Args:
        node: A node returned by `load_yaml` (only call it on a validated, shallow tree).
        path: The key path of `node` itself.

    Returns:
        A dict such as {"": 1, "nodes": 3, "nodes[0]": 4, "nodes[0].name": 4}.
    """
    lines = {path: node.line}
    if isinstance(node, Map):
        for key, child in node.entries.items():
            child_path = join_path(path, key)
            lines.update(collect_lines(child, child_path))
            lines[child_path] = node.key_lines[key]
    elif isinstance(node, Seq):
        for index, item in enumerate(node.items):
            lines.update(collect_lines(item, f"{path}[{index}]"))
    return lines


def _decode(data: bytes, file: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise _invalid(file, line, f"not UTF-8 text (byte 0x{data[err.start]:02x})", "save the file as UTF-8") from None


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, counting the nodes that aliases repeat (see the module's docstring)."""

    def __init__(self, text: str, file: str) -> None:
        super().__init__(text)
        self._file = file
        self._sizes: dict[int, int] = {}
        self._finished: set[int] = set()
        self._repeated = 0

    @classmethod
    def single_node(cls, text: str, file: str) -> yaml.Node | None:
        """What `yaml.compose` returns, composed by this loader."""
        loader = cls(text, file)
        try:
            return loader.get_single_node()
        finally:
            loader.dispose()

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            # An alias of an unfinished node is recursive: the builder refuses it with its path.
            if target is not None and id(target) in self._finished:
                self._count(target, event.start_mark.line + 1)
            return super().compose_node(parent, index)
        node = super().compose_node(parent, index)
        self._finished.add(id(node))
        return node

    def _count(self, target: yaml.Node, line: int) -> None:
        self._repeated += self._size(target)
        if self._repeated > MAX_ALIAS_NODES:
            raise _invalid(
                self._file, line, f"aliases repeat more than {MAX_ALIAS_NODES:,} values in all",
                "write large lists and mappings out once instead of repeating them through aliases",
            )

    def _size(self, node: yaml.Node) -> int:
        """How many nodes `node` stands for, counting what its own aliases repeat (memoised)."""
        key = id(node)
        if key not in self._sizes:
            if isinstance(node, yaml.SequenceNode):
                children = node.value
            elif isinstance(node, yaml.MappingNode):
                children = [part for pair in node.value for part in pair]
            else:
                children = []
            self._sizes[key] = 1 + sum(self._size(child) for child in children)
        return self._sizes[key]


def _compose(text: str, file: str) -> yaml.Node | None:
    try:
        return _Loader.single_node(text, file)
    except yaml.MarkedYAMLError as err:
        raise _from_marked(err, file) from None
    except yaml.reader.ReaderError as err:
        line = text.count("\n", 0, err.position) + 1
        char = chr(err.character) if isinstance(err.character, int) else err.character
        raise _invalid(file, line, f"character {char!r} is not allowed", "remove it") from None
    except yaml.YAMLError as err:
        raise _invalid(file, 1, str(err)) from None


def _from_marked(err: yaml.MarkedYAMLError, file: str, hint: str = _SYNTAX_HINT) -> SpecError:
    mark = err.problem_mark or err.context_mark
    line = mark.line + 1 if mark else 1
    problem = ", ".join(part for part in (err.context, err.problem) if part) or "unreadable"
    if "\\t" in problem:
        hint = "indent with spaces; YAML does not allow tabs"
    return _invalid(file, line, problem, hint)


def _invalid(file: str, line: int, problem: str, hint: str = _SYNTAX_HINT) -> SpecError:
    return SpecError(file, line, "", f"invalid YAML: {problem}", hint)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


class _Builder:
    """Turns composed PyYAML nodes into Map/Seq/Scalar. An alias is built once and shared,
    so a document that repeats an anchor many times stays cheap; a node that contains
    itself through an alias is an error."""

    def __init__(self, file: str) -> None:
        self._file = file
        self._constructor = yaml.constructor.SafeConstructor()
        self._built: dict[int, Node] = {}
        self._open: set[int] = set()

    def build(self, node: yaml.Node, path: str) -> Node:
        key = id(node)
        if key in self._built:
            return self._built[key]
        if key in self._open:
            raise SpecError(
                self._file,
                _line(node),
                path,
                "an alias refers to a node that contains it",
                "aliases may only repeat a finished node",
            )
        self._open.add(key)
        built = self._build_new(node, path)
        self._open.discard(key)
        self._built[key] = built
        return built

    def _build_new(self, node: yaml.Node, path: str) -> Node:
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node)
        self._check_tag(node, _MAP_TAG if isinstance(node, yaml.MappingNode) else _SEQ_TAG)
        if isinstance(node, yaml.MappingNode):
            return self._map(node, path)
        items = tuple(self.build(item, f"{path}[{index}]") for index, item in enumerate(node.value))
        return Seq(items, _line(node))

    def _check_tag(self, node: yaml.Node, expected: str) -> None:
        if node.tag != expected:
            raise _invalid(self._file, _line(node), f"unsupported tag {node.tag!r}", _TAG_HINT)

    def _scalar(self, node: yaml.ScalarNode) -> Scalar:
        try:
            value = self._constructor.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as err:
            raise _from_marked(err, self._file, _TAG_HINT) from None
        # On a tagged scalar with bad text (`!!int ""`, `!!bool x`, `!!timestamp 2024-13-01`)
        # PyYAML's constructors fail with whatever their parsing raises.
        except (ValueError, TypeError, AttributeError, LookupError, ArithmeticError) as err:
            raise _invalid(
                self._file, _line(node), f"cannot read {node.value!r} as {node.tag}: {err}", _TAG_HINT
            ) from None
        return Scalar(value, node.value, _line(node))

    def _map(self, node: yaml.MappingNode, path: str) -> Map:
        entries: dict[str, Node] = {}
        key_lines: dict[str, int] = {}
        merged: list[tuple[str, Node, int]] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.extend(self._merged(value_node, path))
                continue
            key = self._key(key_node, path)
            if key in entries:
                raise SpecError(
                    self._file,
                    _line(key_node),
                    join_path(path, key),
                    f"duplicate key (first set at line {key_lines[key]})",
                    "remove one of them",
                )
            entries[key] = self.build(value_node, join_path(path, key))
            key_lines[key] = _line(key_node)
        for key, value, line in merged:
            if key not in entries:
                entries[key] = value
                key_lines[key] = line
        return Map(entries, key_lines, _line(node))

    def _key(self, node: yaml.Node, path: str) -> str:
        if not isinstance(node, yaml.ScalarNode):
            raise SpecError(
                self._file,
                _line(node),
                path,
                "a key must be plain text, not a list or mapping",
                "check for a stray '?' or brackets before ':'",
            )
        return str(node.value)

    def _merged(self, node: yaml.Node, path: str) -> list[tuple[str, Node, int]]:
        """The entries a `<<:` key brings in, in order; the caller keeps the first of each key."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        merged: list[tuple[str, Node, int]] = []
        for source in sources:
            built = self.build(source, path)
            if not isinstance(built, Map):
                raise _invalid(self._file, _line(source), "'<<' must merge a mapping or a list of mappings")
            merged.extend((key, value, built.key_lines[key]) for key, value in built.entries.items())
        return merged
