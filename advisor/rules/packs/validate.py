"""Checking a rule pack: every problem, each with its file and line.

Validation runs in two passes over the same YAML (read with line marks by
:mod:`advisor.rules.packs.yamlsource`):

1. the pydantic models (:mod:`advisor.rules.packs.spec`): fields, types, ids, enums;
2. for each rule that passed, what needs the table catalogue: table and column names,
   expressions (:mod:`advisor.rules.packs.expressions`), placeholders
   (:mod:`advisor.rules.packs.templates`), names that collide, thresholds never used, the
   ids that ``explains`` and ``redirects`` point at, and the Python check of a rule
   without a condition.

Nothing stops at the first problem: ``validate_file`` returns them all, sorted by line.
``read_pack`` raises :class:`PackInvalid` (a RulePackError) when there is any.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from advisor.errors import RulePackError
from advisor.paths import special_file, table_columns_file
from advisor.rules.packs.expressions import ExpressionError, check_expression
from advisor.rules.packs.spec import (
    FACTS,
    Escalation,
    RuleDocs,
    RulePack,
    RuleSpec,
    SavingSpec,
    ValueRef,
)
from advisor.rules.packs.templates import TemplateError, check_template
from advisor.rules.packs.yamlsource import MAX_PACK_CHARS, Located, YamlSourceError, read_yaml

__all__ = ["PackError", "PackInvalid", "read_pack", "table_columns", "validate_file", "validate_text"]

# Placeholders every data rule's message may use besides its columns and @names.
SAVING_NAMES = {"saving_ns": "the row's estimated saving, ns per step",
                "saving_share": "the same as a share of the mean step (0..1)"}
_DATA_FIELDS = ("table", "values", "derived", "saving", "message", "recommendation", "evidence", "escalate",
                "confidence", "limit")
_ALL_FIELDS = sorted({*RulePack.model_fields, *RuleSpec.model_fields, *RuleDocs.model_fields,
                      *ValueRef.model_fields, *SavingSpec.model_fields, *Escalation.model_fields})


@dataclass(frozen=True, order=True)
class PackError:
    """One problem: where it is and what it is."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


class PackInvalid(RulePackError):
    """A rule pack with problems; ``errors`` lists them all, the message names the first."""

    def __init__(self, errors: list[PackError]) -> None:
        self.errors = list(errors)
        first = str(self.errors[0]) if self.errors else "invalid rule pack"
        more = len(self.errors) - 1
        if more:
            file = self.errors[0].file
            first += f" (and {more} more problem{'s' if more > 1 else ''}: `advisor rules validate {file}` lists them)"
        super().__init__(first)

    def without_content(self) -> str:
        """The problems said by where the first is and how many there are, quoting nothing
        of the file: a problem's words hold its keys and values, which are whatever the file
        holds (a caller that may name any file, an agent, must not read them back)."""
        if not self.errors:
            return "invalid rule pack"
        first, count = self.errors[0], len(self.errors)
        where = f"{first.file}:{first.line}" if first.line else first.file
        return (f"{where}: not a valid rule pack ({count} problem{'s' if count > 1 else ''}; "
                f"`advisor rules validate {first.file}` lists them)")


@functools.cache
def table_columns() -> dict[str, list[str]]:
    """Each summary table's columns as expressions see them (``key`` first): a session's
    tables and a job's cross-rank ones (read by rules that require ranks). Read from the
    committed file advisor.tables.columns writes, so a pack is checked without pandas."""
    return json.loads(table_columns_file().read_text(encoding="utf-8"))


def _not_a_table(name: str, tables: Iterable[str]) -> str:
    """"'modle' is not a summary table (did you mean 'model'?)", or the list of tables
    where nothing is close."""
    tables = list(tables)
    hint = _suggest(name, tables)
    return f"{name!r} is not a summary table" + (hint or f"; the tables are: {', '.join(tables)}")


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def _pydantic_message(err: dict[str, Any], loc: tuple[Any, ...]) -> str:
    kind = err["type"]
    field = _dotted(loc)
    if kind == "missing":
        return f"{field}: is required"
    if kind == "extra_forbidden":
        return f"unknown field {loc[-1]!r}{_suggest(loc[-1], _ALL_FIELDS)}"
    if "[key]" in loc:
        name = loc[loc.index("[key]") - 1]
        if loc[0] == "redirects":
            return f"redirects: {name!r} is not a rule id: lowercase words and digits joined by '-'"
        return (f"{_dotted(loc[:loc.index('[key]') - 1])}: {name!r} is not a name: lowercase letters, "
                f"digits and '_', starting with a letter (it is read as @{name})")
    got = err.get("input")
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    if len(shown) > 60:
        shown = shown[:57] + "..."
    if field.endswith("id") and kind == "string_pattern_mismatch":
        return f"{field}: {shown} is not a rule id: lowercase words and digits joined by '-'"
    if field == "pack" and kind == "string_pattern_mismatch":
        return f"pack: {shown} is not a pack name: lowercase letters, digits, '-' and '_'"
    return f"{field}: {err['msg']} (got {shown})"


class _Checker:
    """Collects the problems of one pack."""

    def __init__(self, source: str, located: Located) -> None:
        self.source = source
        self.located = located
        self.errors: list[PackError] = []

    def add(self, path: tuple[Any, ...], message: str, *, value: bool = False, part: str = "") -> None:
        line = self.located.value_line(path, part) if value else self.located.line(path)
        self.errors.append(PackError(self.source, line, message))


def _rule_label(data: Any, index: int) -> str:
    rule_id = data.get("id") if isinstance(data, dict) else None
    return f"rule {rule_id}" if isinstance(rule_id, str) and rule_id else f"rules[{index}]"


def _check_rule(check: _Checker, spec: RuleSpec, path: tuple[Any, ...], columns_of: dict[str, list[str]],
                registered: set[str] | None) -> RuleSpec:
    """Problems of one rule that the models cannot see; returns the rule with its
    ``tables`` filled in for a data rule that leaves them out."""
    label = f"rule {spec.id}"

    def add(sub: tuple[Any, ...], message: str, value: bool = False, part: str = "") -> None:
        check.add((*path, *sub), f"{label}: {message}", value=value, part=part)

    for i, name in enumerate(spec.tables):
        if name not in columns_of:
            add(("tables", i), _not_a_table(name, columns_of))
    if spec.id in spec.explains:
        add(("explains",), "a rule cannot explain itself")

    if not spec.is_data_rule:
        for name in _DATA_FIELDS:
            if name in spec.model_fields_set:
                add((name,), f"{name} is only for a rule with a condition; a Python rule's check writes its own")
        if registered is not None and spec.id not in registered:
            add(("id",), "has no condition and no Python check is registered under its id (Python rules "
                         "come from installed packages, through the 'advisor.rules' entry point)")
        return spec

    # -- a data rule ----------------------------------------------------------------------
    for name in ("table", "message", "recommendation", "saving"):
        if getattr(spec, name) is None:
            add((name,), f"a rule with a condition needs {name}")
    columns = columns_of.get(spec.table or "")
    if spec.table is not None and columns is None:
        add(("table",), _not_a_table(spec.table, columns_of))
    tables_read = [spec.table] if spec.table else []
    for name, ref in spec.values.items():
        ref_columns = columns_of.get(ref.table)
        if ref_columns is None:
            add(("values", name, "table"), f"value {name}: {_not_a_table(ref.table, columns_of)}")
        elif ref.column not in ref_columns or ref.column == "key":
            add(("values", name, "column"), f"value {name}: {ref.column!r} is not a column of {ref.table}"
                                            f"{_suggest(ref.column, ref_columns)}")
        if ref.table not in tables_read:
            tables_read.append(ref.table)
    if spec.tables:
        for name in tables_read:
            if name not in spec.tables and name in columns_of:
                add(("tables",), f"reads table {name!r}, which its tables list leaves out")
    if columns is None:
        return spec  # nothing below can be checked without the table's columns

    # Names: thresholds and values are @names and placeholders beside the columns.
    reserved = {**{c: f"a column of {spec.table}" for c in columns}, **{f: "a session fact" for f in FACTS},
                **{s: "the saving's placeholder" for s in SAVING_NAMES}}
    for kind, names in (("threshold", spec.thresholds), ("value", spec.values)):
        for name in names:
            if name in reserved:
                add((f"{kind}s", name), f"{kind} {name!r} has the name of {reserved[name]}; rename it")
    for name in set(spec.thresholds) & set(spec.values):
        add(("values", name), f"{name!r} is both a threshold and a value; rename one")
    local_names = {*spec.thresholds, *spec.values, *FACTS}
    for name in spec.derived:
        if name in reserved or name in local_names:
            what = reserved.get(name) or ("a session fact" if name in FACTS else "a threshold or value")
            add(("derived", name), f"derived column {name!r} has the name of {what}; rename it")
    used: set[str] = set()
    failed: list[str] = []  # an expression that failed reads nothing, so no threshold is "unused"
    readable = list(columns)  # the table's columns, then each derived column once defined

    def expression(sub: tuple[Any, ...], text: str, what: str, needs_column: bool = False) -> None:
        try:
            checked = check_expression(text, columns=readable, local_names=local_names, table=spec.table)
        except ExpressionError as exc:
            add(sub, f"{what} {exc}", value=True, part=exc.snippet)
            failed.append(what)
            return
        if needs_column and not checked.columns:
            add(sub, f"{what} reads no column of {spec.table}; pick the rows with one "
                     f"(key == \"Row\" picks a row by its key)", value=True)
        used.update(checked.locals)

    for name, text in spec.derived.items():
        expression(("derived", name), text, f"derived {name}:")
        readable.append(name)

    expression(("condition",), spec.condition, "condition", needs_column=True)
    if spec.saving is not None:
        expression(("saving", "ns_per_step"), spec.saving.ns_per_step, "saving.ns_per_step")
    for i, level in enumerate(spec.escalate):
        expression(("escalate", i, "when"), level.when, f"escalate[{i}].when")
    for i, column in enumerate(spec.evidence):
        if column not in columns or column == "key":
            add(("evidence", i), f"evidence: {column!r} is not a column of {spec.table}"
                                 f"{_suggest(column, columns)}")
    placeholders = {*readable, *local_names, *SAVING_NAMES}
    for name in ("message", "recommendation"):
        text = getattr(spec, name)
        if text is None:
            continue
        try:
            used.update(check_template(text, placeholders))
        except TemplateError as exc:
            add((name,), f"{name}: {exc}", value=True, part=exc.placeholder)
            failed.append(name)
    for name in spec.thresholds:
        if name not in used and not failed:
            add(("thresholds", name), f"threshold {name!r} is never used (write @{name} in an expression "
                                      f"or {{{name}}} in the message)")
    if not spec.tables:
        spec = spec.model_copy(update={"tables": tables_read})
    return spec


def validate_text(text: str, source: str, *, known_ids: Iterable[str] = (),
                  registered: set[str] | None = None) -> tuple[RulePack | None, list[PackError]]:
    """Validate a pack's text; ``source`` names it in messages. ``known_ids`` are rule ids
    outside the pack that ``explains`` and ``redirects`` may name (the built-in rules);
    ``registered``, where given, the ids with a Python check, which a rule without a
    condition must be among. Returns the pack (None where there is any problem) and every
    problem, sorted by line."""
    try:
        located = read_yaml(text)
    except YamlSourceError as exc:
        return None, [PackError(source, exc.line, f"not valid YAML: {exc.message}")]
    check = _Checker(source, located)
    for line, message in located.problems:
        check.errors.append(PackError(source, line, message))
    data = located.data
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        check.add((), f"a rule pack is a mapping with 'pack' and 'rules' (a list of rules); this is {got}")
        return None, sorted(check.errors)

    bad_rules: set[int] = set()
    try:
        RulePack.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
                bad_rules.add(loc[1])
                rule_data = data["rules"][loc[1]]
                message = f"{_rule_label(rule_data, loc[1])}: {_pydantic_message(err, loc[2:])}"
                if len(loc) == 2 and not isinstance(rule_data, dict):
                    message = f"rules[{loc[1]}]: a rule is a mapping with id, title, severity, docs..."
            else:
                message = _pydantic_message(err, loc)
            check.add(tuple(p for p in loc if p != "[key]"), message)

    rules_data = data.get("rules") if isinstance(data.get("rules"), list) else []
    columns_of = table_columns()
    specs: list[tuple[RuleSpec, tuple[Any, ...]]] = []
    first_line: dict[str, int] = {}
    for index, rule_data in enumerate(rules_data):
        if index in bad_rules:
            if isinstance(rule_data, dict) and isinstance(rule_data.get("id"), str):
                first_line.setdefault(rule_data["id"], located.line(("rules", index)))
            continue
        spec = RuleSpec.model_validate(rule_data)
        path = ("rules", index)
        line = located.line(path)
        if spec.id in first_line:
            check.add((*path, "id"), f"rule {spec.id}: the id is used twice in this pack "
                                     f"(first on line {first_line[spec.id]})")
        first_line.setdefault(spec.id, line)
        spec = _check_rule(check, spec, path, columns_of, registered)
        specs.append((spec.located(source, line), path))

    ids = set(first_line)
    known = set(known_ids)
    for spec, path in specs:
        for j, target in enumerate(spec.explains):
            if target not in ids | known:
                check.add((*path, "explains", j), f"rule {spec.id}: explains {target!r}, which is no rule"
                                                  f"{_suggest(target, ids | known)}")
    redirects = data.get("redirects") if isinstance(data.get("redirects"), dict) else {}
    for old, new in redirects.items():
        if old in ids or old in known:
            check.add(("redirects", old), f"redirect {old} -> {new}: {old!r} is still a rule's id")
        if isinstance(new, str) and new not in ids | known:
            check.add(("redirects", old), f"redirect {old} -> {new}: {new!r} is no rule{_suggest(new, ids | known)}")

    if check.errors:
        return None, sorted(check.errors)
    pack = RulePack.model_validate(data)
    pack.rules = [spec for spec, _ in specs]
    pack._source = source
    return pack, []


def _display(path: Path) -> str:
    """The path as the user would type it: relative to the current folder where it is inside."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def validate_file(path: str | Path, *, known_ids: Iterable[str] = (),
                  registered: set[str] | None = None) -> tuple[RulePack | None, list[PackError]]:
    """:func:`validate_text` on a file (every problem, or the pack)."""
    path = Path(path)
    source = _display(path)
    special = special_file(path)
    if special is not None:
        return None, [PackError(source, 0, f"is {special}, not a rule pack file")]
    try:
        # Refused before it is read: a pack larger than yamlsource reads would be held whole first.
        size = path.stat().st_size
        if size > MAX_PACK_CHARS:
            return None, [PackError(source, 0, f"is {size:,} bytes: larger than a rule pack may be "
                                               f"({MAX_PACK_CHARS:,} bytes)")]
        raw = path.read_bytes()
    except IsADirectoryError:
        return None, [PackError(source, 0, "is a folder, not a rule pack file")]
    except FileNotFoundError:
        return None, [PackError(source, 0, "no such rule pack")]
    except OSError as exc:
        return None, [PackError(source, 0, f"cannot be read ({exc.strerror or exc})")]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [PackError(source, 0, f"is not UTF-8 text (byte {exc.start}); a rule pack is YAML")]
    return validate_text(text, source, known_ids=known_ids, registered=registered)


def read_pack(path: str | Path, *, known_ids: Iterable[str] = (), registered: set[str] | None = None) -> RulePack:
    """The pack at ``path``; raises :class:`PackInvalid` listing every problem."""
    pack, errors = validate_file(path, known_ids=known_ids, registered=registered)
    if errors or pack is None:
        raise PackInvalid(errors)
    return pack
