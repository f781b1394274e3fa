"""YAML read with the line of every key and item, so a problem can be reported as
FILE:LINE wherever it is found (pydantic's error locations, expression checks).

PyYAML's composer builds a node tree that keeps each node's start mark; the data is
constructed from the same tree with the safe constructor, so no tag can build a Python
object. Duplicate keys, which YAML forbids and PyYAML would silently collapse, are
reported rather than lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["Located", "YamlSourceError", "read_yaml"]

Path_ = tuple[Any, ...]


class YamlSourceError(Exception):
    """The text is not YAML; ``line`` is 1-based (0 where the parser gave none)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


@dataclass
class Located:
    """The document's data, the line of every path in it, and what the reader found wrong
    with the YAML itself (duplicate keys)."""

    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    # Paths whose value is a block scalar (| or >): its text starts on the next line.
    blocks: set[Path_] = field(default_factory=set)
    # First and last line of each scalar value, for finding a part of it.
    spans: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    text_lines: list[str] = field(default_factory=list)
    problems: list[tuple[int, str]] = field(default_factory=list)

    def line(self, path: Path_) -> int:
        """The line of ``path``, or of its nearest ancestor that has one (a missing field is
        reported where its parent is)."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    def value_line(self, path: Path_, part: str = "") -> int:
        """The line of the value at ``path`` (past a block scalar's indicator) or, where
        ``part`` is given and found in it, the line where ``part`` starts."""
        path = tuple(path)
        line = self.line(path)
        first = line + 1 if path in self.blocks else line
        words = part.split()
        if not words or path not in self.spans:
            return first
        probe = words[0] if len(words[0]) >= 3 or len(words) == 1 else " ".join(words[:2])
        start, end = self.spans[path]
        for number in range(max(first, start), end + 1):
            if probe in " ".join(self.text_lines[number - 1].split()):
                return number
        return first


# Values a document's aliases may add: each alias repeats the node it names, with all that
# is below it. A rule pack uses a few (thresholds shared between rules); a chain of anchors
# that each repeat the last ("billion laughs") adds billions, and reading it as data would
# never end. The values the text itself holds are bounded by its size (MAX_PACK_CHARS), not
# here: a pack of thousands of rules is large, not a bomb.
MAX_ALIAS_VALUES = 200_000


class _Refused(YamlSourceError):
    """YAML refused for its shape or size, not for its syntax: the other parser is not
    asked for its words."""


def _within_budget(root: yaml.Node) -> None:
    written: set[int] = set()  # the nodes the text holds, by identity (an alias repeats one)
    repeated = 0
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_FLOW_DEPTH:
            raise _Refused(node.start_mark.line + 1, f"values nested more than {MAX_FLOW_DEPTH} deep: "
                                                     "deeper than a rule pack needs")
        if id(node) in written:
            repeated += 1
            if repeated > MAX_ALIAS_VALUES:
                raise _Refused(node.start_mark.line + 1,
                               f"anchors and aliases expand to more than {MAX_ALIAS_VALUES:,} values "
                               "beyond those written; a rule pack repeats far fewer (is this a YAML bomb?)")
        else:
            written.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.extend(((key, depth + 1), (value, depth + 1)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, depth + 1) for item in node.value)


def _scalar(node: yaml.Node, path: Path_, out: Located) -> None:
    if not isinstance(node, yaml.ScalarNode):
        return
    if node.style in ("|", ">"):
        out.blocks.add(path)
    # end_mark is just past the value: on the next line's column 0 after a block scalar.
    end = node.end_mark.line + (1 if node.end_mark.column else 0)
    out.spans[path] = (node.start_mark.line + 1, max(end, node.start_mark.line + 1))


def _walk(node: yaml.Node, path: Path_, out: Located) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key in seen:
                message = f"key {key!r} appears twice in the same mapping (first on line {seen[key]})"
                out.problems.append((line, message))
            seen.setdefault(key, line)
            child = (*path, key)
            out.lines[child] = line
            _scalar(value_node, child, out)
            _walk(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            out.lines[child] = item.start_mark.line + 1
            _scalar(item, child, out)
            _walk(item, child, out)


# libyaml's parser where PyYAML was built with it: the same nodes and marks, several
# times faster (the built-in pack is read on every run).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# How deep a rule pack may nest, by indentation or by [ and { (a pack nests five levels):
# PyYAML's composer and constructor recurse, and 5 000 levels would overflow the stack.
MAX_INDENT = 256
MAX_FLOW_DEPTH = 64
# How large a pack may be, in characters: the parser holds some hundreds of bytes per value
# it reads, so this bounds its memory (a pack of 5,000 fully documented rules, 12 MB, takes
# 0.4 GB to read).
MAX_PACK_CHARS = 16 * 2**20
# Characters YAML does not allow in a document: C0 controls but tab, newline and return, DEL,
# C1 controls but NEL, lone surrogates, and U+FFFE/U+FFFF.
_NOT_ALLOWED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")
_DEEP_INDENT = re.compile(f"^ {{{MAX_INDENT + 1},}}", re.MULTILINE)
_BRACKETS = re.compile(r"[\[\]{}]")


def _shape_checked(text: str) -> None:
    """Refuse, before parsing, what the parser would choke on: a text larger than any pack,
    control characters and nesting deeper than any pack needs. (Found by regular
    expressions, not a loop over the characters: a large pack has millions.)"""
    if len(text) > MAX_PACK_CHARS:
        raise _Refused(0, f"{len(text):,} characters: larger than a rule pack may be ({MAX_PACK_CHARS:,})")
    bad = _NOT_ALLOWED.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        raise _Refused(line, f"control character U+{ord(bad.group()):04X} is not allowed in YAML")
    deep = _DEEP_INDENT.search(text)
    if deep is not None:
        raise _Refused(text.count("\n", 0, deep.start()) + 1, f"indented more than {MAX_INDENT} columns: nested "
                                                               "deeper than a rule pack needs")
    depth = 0
    for bracket in _BRACKETS.finditer(text):
        if bracket.group() in "[{":
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                raise _Refused(text.count("\n", 0, bracket.start()) + 1, f"[ and {{ nested more than "
                                                                         f"{MAX_FLOW_DEPTH} deep: deeper than a "
                                                                         "rule pack needs")
        else:
            depth = max(depth - 1, 0)


def read_yaml(text: str) -> Located:
    """Parse one YAML document; raises :class:`YamlSourceError` where it is not YAML."""
    _shape_checked(text)
    try:
        return _read(text, _LOADER)
    except _Refused:
        raise
    except YamlSourceError:
        if _LOADER is yaml.SafeLoader:
            raise
        return _read(text, yaml.SafeLoader)  # not YAML: PyYAML's own words for why, and where


def _read(text: str, loader_class: type) -> Located:
    try:
        loader = loader_class(text)
    except yaml.YAMLError as exc:  # the reader's own check of the characters
        raise YamlSourceError(0, str(exc).splitlines()[0] if str(exc) else "not valid YAML") from None
    try:
        root = loader.get_single_node()
        if root is None:
            return Located(data=None, lines={(): 1})
        _within_budget(root)
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = str(exc.problem or exc.context or "not valid YAML")
        if exc.context and exc.problem:
            where = exc.context_mark
            begun = f" begun on line {where.line + 1}" if where is not None and where is not mark else ""
            problem += f" ({exc.context}{begun})"
        raise YamlSourceError(mark.line + 1 if mark else 0, problem) from None
    except yaml.YAMLError as exc:
        raise YamlSourceError(0, str(exc).splitlines()[0] if str(exc) else "not valid YAML") from None
    except RecursionError:
        raise YamlSourceError(0, "nested deeper than a rule pack needs") from None
    finally:
        loader.dispose()
    out = Located(data=data, lines={(): root.start_mark.line + 1}, text_lines=text.splitlines())
    _walk(root, (), out)
    return out
