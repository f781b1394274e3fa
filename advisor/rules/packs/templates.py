"""Message and recommendation templates of data rules: ``{placeholder}`` filled from the
evidence row.

A placeholder is a plain name: a column of the rule's table, ``key``, a threshold, a value,
a session fact, or ``saving_ns`` / ``saving_share`` (the row's estimated saving). Without
a format it is written as the reports write that kind of figure, judged by its name
(``{cpu_avg_ns}`` -> "7.19 ms", ``{cpu_ratio}`` -> "41.1%"); a format says how:

    {cpu_ratio:%}     a share, 0.411 -> "41.1%"
    {gpu_avg_ns:time} nanoseconds as a duration -> "7.19 ms"
    {bytes_total:bytes} bytes -> "1.50 MiB"
    {calls:count}     a count -> "12,345" / "1.23 M"
    {ratio:.1f}       any Python format for a number

Only plain names are allowed: ``{row.__class__}``, ``{row[0]}``, ``{0}``, ``{}`` and
conversions (``!r``) are refused when the pack is checked, and the formatter looks names
up in a flat dict, so a template can never reach an attribute.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

from advisor.units import (
    format_bytes,
    format_cell,
    format_count,
    format_ns,
    format_ratio,
)

__all__ = ["FORMATS", "TemplateError", "check_template", "fill"]

FORMATS = {
    "%": format_ratio,
    "time": format_ns,
    "bytes": format_bytes,
    "count": format_count,
}

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# The widths and precisions a format may ask for: '{calls:.999999999f}' would write a
# gigabyte into the report.
MAX_WIDTH = 40
_NUMBERS = re.compile(r"\d+")


def _too_wide(spec: str) -> bool:
    return any(int(digits) > MAX_WIDTH for digits in _NUMBERS.findall(spec))


class TemplateError(ValueError):
    """A template with a placeholder that is not allowed; ``placeholder`` is its text."""

    def __init__(self, message: str, placeholder: str = "") -> None:
        super().__init__(message)
        self.placeholder = placeholder


def _fields(template: str) -> list[tuple[str, str, str | None]]:
    try:
        return [(name, spec or "", conversion) for _, name, spec, conversion in string.Formatter().parse(template)
                if name is not None]
    except ValueError as exc:  # "Single '}' encountered", "unmatched '{'"
        raise TemplateError(f"{exc}; write {{{{ and }}}} for literal braces") from None


def check_template(template: str, names: Iterable[str]) -> set[str]:
    """The placeholders ``template`` uses; raises :class:`TemplateError` for one that is not
    a known plain name, has a conversion, or a format that cannot format a number."""
    if not isinstance(template, str):
        raise TemplateError(f"must be text, not {type(template).__name__}")
    names = set(names)
    used: set[str] = set()
    for name, spec, conversion in _fields(template):
        if name == "":
            raise TemplateError("{} needs a name, as in {cpu_avg_ns}", "{}")
        if not _NAME.match(name):
            raise TemplateError(f"{{{name}}}: a placeholder is a plain name: no attributes, indexes or numbers",
                                f"{{{name}")
        if conversion is not None:
            raise TemplateError(f"{{{name}!{conversion}}}: conversions are not allowed", f"{{{name}!")
        if "{" in spec:
            raise TemplateError(f"{{{name}:{spec}}}: nested placeholders are not allowed", f"{{{name}:")
        if name not in names:
            raise TemplateError(f"{{{name}}} is not a column, threshold, value or fact of this rule", f"{{{name}")
        if spec and spec not in FORMATS:
            if _too_wide(spec):
                raise TemplateError(f"{{{name}:{spec}}}: a width or precision of at most {MAX_WIDTH} (a figure in "
                                    "a message needs no more)", f"{{{name}:")
            try:
                format(1.5, spec)
            except (ValueError, TypeError):
                raise TemplateError(f"{{{name}:{spec}}}: {spec!r} is not a format for a number "
                                    f"(use %, time, bytes, count or a Python format such as .2f)",
                                    f"{{{name}:") from None
        used.add(name)
    return used


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict, str)) else value


def _format(name: str, value: Any, spec: str) -> str:
    value = _plain(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if spec in FORMATS:
        return FORMATS[spec](value)
    if spec:
        if _too_wide(spec):  # never validated: written as if it had no format
            return format_cell(name, value)
        try:
            return format(value, spec)
        except (ValueError, TypeError):
            return str(value)
    return format_cell(name, value)


def fill(template: str, values: Mapping[str, Any]) -> str:
    """The template with each placeholder replaced by its value, formatted."""
    out = []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        if not _NAME.match(name or "") or conversion is not None or name not in values:
            raise TemplateError(f"{{{name}}} cannot be filled")
        out.append(_format(name, values[name], spec or ""))
    return "".join(out)
