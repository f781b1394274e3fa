"""Human units for findings and reports: durations, byte counts, shares and table cells.

One place decides how a number looks, so the terminal, Markdown and HTML reports agree:
``format_ns(1_234_000) == "1.23 ms"``, ``format_ratio(0.41) == "41.0%"``,
``format_saving(saving) == "12.3 ms/step (41% of step; between 6.10 ms and 14.0 ms)"``. Values are shown with three
significant digits in the largest unit that keeps them at 1 or more. The JSON report never
goes through here: it keeps the raw values.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a type only: figures are formatted for every stage, findings included
    from advisor.findings import Saving

__all__ = [
    "MISSING",
    "format_bytes",
    "format_cell",
    "format_count",
    "format_ms",
    "format_ns",
    "format_number",
    "format_percent",
    "format_ratio",
    "format_saving",
    "format_share",
    "is_number",
    "valid_text",
]

MISSING = "-"

_TIME_UNITS = ((1.0, "ns"), (1e3, "us"), (1e6, "ms"), (1e9, "s"))
_BYTE_UNITS = ((1, "B"), (1024, "KiB"), (1024**2, "MiB"), (1024**3, "GiB"), (1024**4, "TiB"))
_SI_UNITS = ((1.0, ""), (1e3, "K"), (1e6, "M"), (1e9, "G"), (1e12, "T"), (1e15, "P"))

# Column-name hints that say what a table cell holds. Tables name their columns in the
# user's words (``total_ns``, ``gpu_ratio``, ``bytes``), so the name is enough to pick a unit.
# Whole words of the name: "share_of_step" is a share, "shared_memory" is not.
_RATIO_WORDS = {"ratio", "share", "utilization", "utilisation", "efficiency", "occupancy", "fraction"}
_PERCENT_HINTS = ("_pct", "percent")


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: a lone surrogate (a JSON escape like ``\\ud800``, a file
    name that is not UTF-8) becomes U+FFFD, so every writer (JSON, Parquet, HTML) takes it."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:  # a file name's undecodable bytes, as Python keeps them: one U+FFFD a byte
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a JSON escape of half a surrogate pair
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


# Control characters a terminal would act on (ESC starts a sequence that can set the window
# title, clear the screen or write the clipboard), DEL and the C1 range; tab and newline are
# text.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown_safely(text: str) -> str:
    """``text`` from a trace or a session as a terminal, Markdown or an agent may show it:
    each control character written as its escape (``\\x1b``), so none reaches the reader
    as a command."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if _CONTROLS.search(text) else text


# A spreadsheet reads a cell that starts with one of these as a formula (OWASP's CSV
# injection list): such a text cell is written with a leading apostrophe, which the
# spreadsheet shows as text and never runs.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(text: str) -> str:
    """A text cell of advisor's CSV: its control characters escaped (``shown_safely``),
    and a leading apostrophe where a spreadsheet would take it for a formula."""
    text = shown_safely(text)
    return "'" + text if text.startswith(_FORMULA_START) else text


def safe_strings(value: Any) -> Any:
    """``value`` (dicts, lists, strings, as a report dumps them) with every string shown safely."""
    if isinstance(value, str):
        return shown_safely(value)
    if isinstance(value, dict):
        return {shown_safely(k) if isinstance(k, str) else k: safe_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(safe_strings(v) for v in value)
    return value


def is_number(value: Any) -> bool:
    """True for ints and floats (not bools), NaN included."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _three_digits(x: float) -> str:
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _scaled(value: float, units: tuple[tuple[float, str], ...]) -> str:
    """``value`` in the largest unit that keeps it at 1 or more, three significant digits.

    The unit is chosen after rounding, so 999.7 us prints as "1.00 ms", not "1000 us".
    """
    a = abs(value)
    chosen = units[0]
    for factor, name in units:
        if a >= factor:
            chosen = (factor, name)
    factor, name = chosen
    text = _three_digits(value / factor)
    index = units.index(chosen)
    if abs(float(text)) >= 1000 and index + 1 < len(units):
        factor, name = units[index + 1]
        text = _three_digits(value / factor)
    return f"{text} {name}".rstrip()


def format_ns(ns: Any) -> str:
    """A duration in nanoseconds: ``"850 ns"``, ``"456 us"``, ``"1.23 ms"``, ``"2.05 s"``."""
    if _missing(ns) or not is_number(ns):
        return MISSING
    if abs(ns) < 1000:
        return f"{ns:.0f} ns"
    return _scaled(float(ns), _TIME_UNITS)


def format_ms(ms: Any) -> str:
    """A duration in milliseconds, in the same style as :func:`format_ns`."""
    if _missing(ms) or not is_number(ms):
        return MISSING
    if ms == 0:
        return "0 ms"
    return format_ns(ms * 1e6)


def format_ratio(ratio: Any) -> str:
    """A share given as 0..1: ``0.41 -> "41.0%"``."""
    if _missing(ratio) or not is_number(ratio):
        return MISSING
    return f"{ratio * 100:.1f}%"


def format_percent(percent: Any) -> str:
    """A value already in percent: ``41 -> "41.0%"``."""
    if _missing(percent) or not is_number(percent):
        return MISSING
    return f"{percent:.1f}%"


def format_share(share: Any) -> str:
    """A share of the step in whole percent (``"41%"``); below 1% one decimal (``"0.4%"``)."""
    if _missing(share) or not is_number(share):
        return MISSING
    pct = share * 100
    if pct == 0 or abs(pct) >= 1:
        return f"{pct:.0f}%"
    return f"{pct:.1f}%"


def format_saving(saving: Saving) -> str:
    """``"12.3 ms/step (41% of step)"`` (``/pass`` where the profile shows its work once);
    a finding that saves nothing by itself (its basis
    starts "none: ...", as profile-incomplete's) reads ``"n/a (...)"``, and one whose
    saving could not be measured (its basis starts "unknown: ...") ``"unknown (...)"``."""
    if not saving.ms_per_step and saving.basis.startswith(("none", "unknown")):
        label, _, reason = saving.basis.partition(":")
        label = "unknown" if label.strip() == "unknown" else "n/a"
        return f"{label} ({reason.strip()})" if reason.strip() else label
    low, high = getattr(saving, "low_ms_per_step", None), getattr(saving, "high_ms_per_step", None)
    between = (f"; between {format_ms(low)} and {format_ms(high)}"
               if low is not None and high is not None and format_ms(low) != format_ms(high) else "")
    per = getattr(saving, "per", "step") or "step"
    busy = getattr(saving, "busy_share", None)
    if busy:
        # On a busy machine the milliseconds stretch with the load and the share holds: the
        # share leads, the milliseconds are said to be this run's.
        return (f"{format_share(saving.share_of_step)} of each {per} ({format_ms(saving.ms_per_step)}/{per} at this "
                f"run's load: the main thread waited for a core {format_share(busy)} of its time{between})")
    return f"{format_ms(saving.ms_per_step)}/{per} ({format_share(saving.share_of_step)} of {per}{between})"


def format_bytes(n: Any) -> str:
    """A byte count in binary units: ``"512 B"``, ``"1.50 KiB"``, ``"3.20 GiB"``."""
    if _missing(n) or not is_number(n):
        return MISSING
    if abs(n) < 1024:
        return f"{n:.0f} B"
    return _scaled(float(n), _BYTE_UNITS)


def format_count(n: Any) -> str:
    """A large count with an SI suffix: ``"1.23 G"``; below a million, digits with commas."""
    if _missing(n) or not is_number(n):
        return MISSING
    if abs(n) < 1e6:
        return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.4g}"
    return _scaled(float(n), _SI_UNITS)


def format_number(value: Any) -> str:
    """A plain number: ints with thousands separators, floats with four significant
    digits (SI suffix from a million up)."""
    if _missing(value) or not is_number(value):
        return MISSING
    if isinstance(value, int):
        return f"{value:,}" if abs(value) < 1e6 else format_count(value)
    if abs(value) >= 1e6:
        return format_count(value)
    return f"{value:.4g}"


def is_time_column(column: str) -> bool:
    """Whether a column holds nanoseconds by its name: ``*_ns``, ``ns`` or ``ns_*``
    (autograd_nodes' ``ns_per_step``)."""
    name = column.lower()
    return name.endswith("_ns") or name == "ns" or name.startswith("ns_")


def _column_kind(column: str) -> str:
    name = column.lower()
    if is_time_column(name):
        return "time"
    if name.endswith("_ms"):
        return "time_ms"
    if "bytes" in name and not any(rate in name for rate in ("gbps", "per_s", "bandwidth")):
        return "bytes"
    if any(h in name for h in _PERCENT_HINTS):
        return "percent"
    if _RATIO_WORDS & set(name.split("_")):
        return "ratio"
    if "flops" in name or "flop_s" in name:
        return "count"
    return "number"


# A table whose rows hold different quantities names each row's unit in a "unit" column.
_ROW_UNITS = {"ns": "time", "ms": "time_ms", "bytes": "bytes", "B": "bytes", "ratio": "ratio", "%": "percent"}


def format_cell(column: str, value: Any, *, unit: str | None = None, max_chars: int | None = None) -> str:
    """A table cell for people, its unit read from the column name (``*_ns`` durations,
    ``*bytes*`` byte counts, ``*ratio``/``*share``/``*utilization`` shares, ``*_pct``
    percentages) or from ``unit``, the row's own unit ("ns", "bytes", ...) where the table
    has one; other numbers plain, text as it is, cut to ``max_chars`` if given."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, dict)):
        text = json.dumps(value, separators=(",", ":"), default=str)
    elif is_number(value):
        kind = _ROW_UNITS.get(unit or "", "") or _column_kind(str(column))
        if kind == "time":
            return format_ns(value)
        if kind == "time_ms":
            return format_ms(value)
        if kind == "bytes":
            return format_bytes(value)
        if kind == "percent":
            return format_percent(value)
        if kind == "ratio":
            return format_ratio(value)
        if kind == "count":
            return format_count(value)
        return format_number(value)
    else:
        text = str(value)
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 3] + "..."
    return text
