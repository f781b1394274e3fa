"""Expressions in rule packs: checked against a whitelist, then evaluated by pandas.

A data rule's ``condition``, its ``saving.ns_per_step`` and its ``escalate`` conditions are
expressions in pandas' ``DataFrame.eval`` syntax, evaluated over one summary table (one
result per row):

    key == "Optimization" and cpu_avg_ns > @ratio * (@forward_ns + @backward_ns)
    calls / @steps > @max_calls_per_step
    not key.str.startswith("Optimizer.") and cpu_ratio >= @share

- a bare name is a column of the table, ``key`` (the row's stable key), or one of the
  rule's ``derived`` columns (expressions of the same kind, computed first);
- ``@name`` is a threshold, a value (one table cell the rule names) or a session fact
  (``@steps``, ``@mean_step_ns``...; see :data:`advisor.rules.packs.spec.FACTS`);
- numbers, strings, True/False; ``+ - * / // %``; comparisons (chained too); ``and or
  not`` (or ``& | ~``); ``in`` / ``not in`` a list of constants;
- the functions ``abs sqrt log log10 log1p exp floor ceil`` of one argument, and
  ``COLUMN.str.startswith("x")``, ``.str.endswith("x")``, ``.str.contains("x")`` (a regular
  expression) on a text column.

Nothing else: no other call, attribute, subscript, lambda, comprehension, conditional
expression, walrus, f-string, ``**`` (a tiny expression could ask for a number with
billions of digits) or arithmetic on string constants (``"a" * 10**9``). The text is
parsed with Python's own ``ast`` (after the ``@name`` references are rewritten, token by
token, so an ``@`` inside a string is left alone) and every node is checked against the
whitelist before pandas ever sees it; :func:`evaluate` checks again, so an expression
that skipped pack validation still cannot run code.
"""

from __future__ import annotations

import ast
import difflib
import io
import tokenize
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FUNCTIONS",
    "MAX_LENGTH",
    "STR_METHODS",
    "Checked",
    "ExpressionError",
    "check_expression",
    "evaluate",
    "evaluation_frame",
]

FUNCTIONS = ("abs", "sqrt", "log", "log10", "log1p", "exp", "floor", "ceil")
STR_METHODS = ("startswith", "endswith", "contains")
MAX_LENGTH = 1000
MAX_NODES = 300

# What a reference to @name turns into for Python's parser: a name no column can have.
_LOCAL = "ADVISORLOCAL_"

_BOOL_OPS = (ast.And, ast.Or)
_UNARY_OPS = (ast.Not, ast.USub, ast.UAdd, ast.Invert)
_BIN_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr)
_COMPARE_OPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn)

# Names for the refused node types, in the user's words.
_REFUSED = {
    ast.Attribute: "attribute access",
    ast.Subscript: "subscripts ([...])",
    ast.Lambda: "lambdas",
    ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.GeneratorExp: "comprehensions",
    ast.IfExp: "conditional expressions (x if c else y)",
    ast.NamedExpr: "assignment (:=)",
    ast.JoinedStr: "f-strings",
    ast.Starred: "starred arguments",
    ast.Dict: "dict literals",
    ast.Set: "set literals",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
    ast.Slice: "slices",
}


class ExpressionError(ValueError):
    """An expression that is not allowed; the message quotes the offending text, which
    ``snippet`` holds (as written, so a pack's checker can find its line)."""

    def __init__(self, message: str, snippet: str = "") -> None:
        super().__init__(message)
        self.snippet = snippet


@dataclass
class Checked:
    """What a valid expression reads: table columns and @names."""

    text: str
    columns: set[str] = field(default_factory=set)
    locals: set[str] = field(default_factory=set)


def _rewrite_locals(text: str) -> str:
    """``@name`` -> a plain name Python can parse, token by token (so "a @ b" inside a
    string is untouched). Raises ExpressionError for text Python cannot tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        raise ExpressionError(f"cannot be parsed: {exc.args[0] if exc.args else exc}") from None
    out = []
    last = 0  # column offset in the one-line text
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.type == tokenize.OP and tok.string == "@":
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is None or nxt.type != tokenize.NAME:
                raise ExpressionError("'@' must be followed by the name of a threshold, value or fact")
            if nxt.start[1] != tok.end[1]:
                raise ExpressionError(f"write '@{nxt.string}' without a space after '@'")
            out.append(text[last:tok.start[1]])
            out.append(_LOCAL + nxt.string)
            last = nxt.end[1]
            i += 2
            continue
        i += 1
    out.append(text[last:])
    return "".join(out)


def _snippet(node: ast.AST, source: str) -> str:
    text = ast.get_source_segment(source, node) or ast.unparse(node)
    return text.replace(_LOCAL, "@")


def _is_text_constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def normalise(text: str) -> str:
    """An expression may span lines in YAML; it is one line to pandas."""
    return " ".join(str(text).split())


def check_expression(text: str, *, columns: Iterable[str], local_names: Iterable[str],
                     table: str = "the table") -> Checked:
    """Check ``text`` against the whitelist; returns what it reads or raises
    :class:`ExpressionError` naming the first offending part (``table`` names the table
    in messages)."""
    if not isinstance(text, str):
        raise ExpressionError(f"must be text, not {type(text).__name__}")
    text = normalise(text)
    if not text:
        raise ExpressionError("is empty")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"is {len(text)} characters long; at most {MAX_LENGTH} are allowed")
    if "`" in text:
        raise ExpressionError("backtick-quoted names are not allowed; every column name is a plain word", "`")
    source = _rewrite_locals(text)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"is not an expression ({exc.msg})") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ExpressionError(f"has {len(nodes)} parts; at most {MAX_NODES} are allowed")
    columns = set(columns)
    local_names = set(local_names)
    found = Checked(text=text)
    allowed_calls: set[int] = set()  # ids of the func nodes of allowed calls
    in_lists: set[int] = set()  # List/Tuple nodes that are the right side of `in`

    def refuse(node: ast.AST, message: str) -> ExpressionError:
        snippet = _snippet(node, source)
        return ExpressionError(f"`{snippet}`: {message}", snippet)

    for node in nodes:
        if isinstance(node, ast.Call):
            func = node.func
            if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                raise refuse(node, "keyword and starred arguments are not allowed")
            if isinstance(func, ast.Name) and func.id in FUNCTIONS:
                if len(node.args) != 1:
                    raise refuse(node, f"{func.id}() takes one argument")
                allowed_calls.add(id(func))
                continue
            if (isinstance(func, ast.Attribute) and func.attr in STR_METHODS
                    and isinstance(func.value, ast.Attribute) and func.value.attr == "str"
                    and isinstance(func.value.value, ast.Name)
                    and not func.value.value.id.startswith(_LOCAL)):
                if len(node.args) != 1 or not _is_text_constant(node.args[0]):
                    raise refuse(node, f".str.{func.attr}() takes one string")
                allowed_calls.update({id(func), id(func.value)})
                continue
            raise refuse(node, f"calling {_snippet(func, source)} is not allowed; the functions are "
                               f"{', '.join(FUNCTIONS)} and COLUMN.str.{{{','.join(STR_METHODS)}}}(\"text\")")
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    if not isinstance(right, (ast.List, ast.Tuple)) or not all(
                            isinstance(e, ast.Constant) for e in right.elts):
                        raise refuse(node, "`in` takes a list of constants, as in key in [\"Forward\", \"Backward\"]")
                    in_lists.add(id(right))

    for node in nodes:
        if isinstance(node, (ast.Expression, ast.Load)):
            continue
        if isinstance(node, ast.Name):
            if id(node) in allowed_calls:
                continue
            if node.id.startswith(_LOCAL):
                name = node.id[len(_LOCAL):]
                if name.startswith("_"):
                    raise refuse(node, "names starting with '_' are not allowed")
                if name not in local_names:
                    known = ", ".join(f"@{n}" for n in sorted(local_names)) or "none"
                    raise refuse(node, f"not a threshold, value or fact of this rule (it has: {known})")
                found.locals.add(name)
                continue
            if node.id.startswith("_"):
                raise refuse(node, "names starting with '_' are not allowed")
            if node.id not in columns:
                if node.id in local_names:
                    hint = f"; thresholds, values and facts are written @{node.id}"
                else:
                    close = difflib.get_close_matches(node.id, sorted(columns), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise refuse(node, f"not a column of {table}{hint}")
            found.columns.add(node.id)
            continue
        if isinstance(node, ast.Attribute):
            if id(node) in allowed_calls:
                continue
            raise refuse(node, "attribute access is not allowed")
        if isinstance(node, ast.Call):
            continue  # checked above
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (bool, int, float, str)):
                continue
            raise refuse(node, "only numbers, strings, True and False are allowed as constants")
        if isinstance(node, (ast.List, ast.Tuple)):
            if id(node) in in_lists:
                continue
            raise refuse(node, "lists are only allowed after `in`")
        if isinstance(node, ast.BoolOp) and isinstance(node.op, _BOOL_OPS):
            continue
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY_OPS):
            continue
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                raise refuse(node, "** is not allowed (write x * x)")
            if not isinstance(node.op, _BIN_OPS):
                raise refuse(node, f"the operator {type(node.op).__name__} is not allowed")
            if _is_text_constant(node.left) or _is_text_constant(node.right):
                raise refuse(node, "arithmetic on strings is not allowed")
            continue
        if isinstance(node, ast.Compare):
            if any(not isinstance(op, _COMPARE_OPS) for op in node.ops):
                raise refuse(node, "`is` and `is not` are not allowed; use == and !=")
            continue
        if isinstance(node, (ast.operator, ast.boolop, ast.unaryop, ast.cmpop, ast.expr_context)):
            continue
        raise refuse(node, f"not allowed ({_REFUSED.get(type(node), type(node).__name__)})")
    return found


def evaluation_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The table as expressions see it: ``key`` a column, numbers as numbers, text as
    pandas strings (so arithmetic on text fails instead of repeating it)."""
    # pandas is imported where an expression is evaluated: checking a pack (`advisor rules
    # list`, `validate`) needs none of it.
    import numpy as np
    import pandas as pd

    frame = table.reset_index()
    if "key" not in frame.columns:  # a table built without its index name
        frame = frame.rename(columns={frame.columns[0]: "key"})
    for column in frame.columns:
        series = frame[column]
        if series.dtype != object:
            continue
        present = series.dropna()
        if present.map(lambda v: isinstance(v, (int, float, np.number)) and not isinstance(v, bool)).all():
            frame[column] = pd.to_numeric(series, errors="coerce").astype(float)
        elif present.map(lambda v: isinstance(v, str)).all():
            frame[column] = series.astype("string")
    return frame


def evaluate(text: str, frame: pd.DataFrame, local_values: Mapping[str, Any], *,
             columns: Iterable[str] | None = None) -> pd.Series:
    """Evaluate a checked expression over ``frame`` (from :func:`evaluation_frame`): one
    value per row. It is checked again here; pandas resolves @names from
    ``local_values`` only (no caller's variables, no globals)."""
    import pandas as pd

    checked = check_expression(text, columns=frame.columns if columns is None else columns,
                               local_names=local_values.keys())
    if not len(frame):
        return pd.Series([], dtype=float)
    with warnings.catch_warnings():
        # .str.contains with a group in its pattern: pandas warns on stderr that the group
        # does not capture, on every row's evaluation; the match is what the rule meant.
        warnings.filterwarnings("ignore", message="This pattern is interpreted as a regular expression")
        result = frame.eval(checked.text, engine="python", parser="pandas",
                            local_dict=dict(local_values), global_dict={})
    if not isinstance(result, pd.Series):  # an expression of @names and constants only
        result = pd.Series([result] * len(frame), index=frame.index)
    return result
