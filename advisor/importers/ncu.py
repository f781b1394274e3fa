"""Nsight Compute's counters for the kernels a user profiled, read from its CSV pages.

``ncu`` profiles chosen kernels (``-k regex:gemm -c 6``) with hardware counters; its report
reads back as CSV: ``ncu --import r.ncu-rep --csv --page raw`` gives a row per kernel and a
column per metric (a second row holds the units), ``--page details`` a row per metric of
each section and per rule ncu applied, with its estimated speedup. advisor reads either or
both (an ``.ncu-rep`` through ``ncu --import`` where ncu is installed) into one record per
profiled kernel: what the kernel_counters table and the rules need, nothing more.

Each record: ``id`` (ncu's), ``kernel`` (its name), ``grid`` and ``block`` ("[x,y,z]", as
advisor's sessions spell them), ``duration_ns``, ``sm_pct`` and ``memory_pct`` (throughput
as % of peak, ncu's Speed Of Light), ``dram_pct``, ``achieved_occupancy`` and
``theoretical_occupancy`` (%), ``limiter`` (what bounds the theoretical occupancy: registers,
shared memory, warps or blocks), ``waves`` (per SM), ``registers`` (per thread),
``tensor_pct`` and ``fma_pct`` (the tensor and FMA pipes' issue utilisation, %), and
``rules`` (ncu's rule verdicts: name, type, section, estimated speedup and its kind, the
description's first sentence). A figure the pages lack is None.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

from advisor.errors import TraceError

__all__ = ["NCU_KEY", "attach", "exports_in", "is_ncu_csv", "read_ncu", "read_ncu_text"]

NCU_KEY = "ncu"  # where a session keeps them: trace_metadata["ncu"] = {"source": ..., "kernels": [...]}
IMPORT_TIMEOUT_S = 300
# Bounds on what is read: an export of a few hundred kernels' raw pages is tens of MB.
MAX_EXPORT_BYTES = 512 << 20
MAX_FIELD_CHARS = 1 << 20  # one CSV cell (a kernel's demangled name runs to a few thousand characters)
MAX_NAME_CHARS = 4096  # a kernel name kept longer than this is cut, and said
MAX_ID_DIGITS = 18
_PERCENT_FIELDS = ("sm_pct", "memory_pct", "dram_pct", "achieved_occupancy", "theoretical_occupancy", "tensor_pct",
                   "fma_pct")

# raw page column -> record field
_RAW = {
    "gpu__time_duration.sum": "duration",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy",
    "launch__waves_per_multiprocessor": "waves",
    "launch__registers_per_thread": "registers",
    "launch__occupancy_limit_registers": "limit_registers",
    "launch__occupancy_limit_shared_mem": "limit_shared_memory",
    "launch__occupancy_limit_warps": "limit_warps",
    "launch__occupancy_limit_blocks": "limit_blocks",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": "fma_pct",
}
# Tensor pipes by generation: the largest of these is the kernel's tensor utilisation.
_TENSOR = re.compile(r"^sm__(inst_executed_pipe_tensor_op_\w+|pipe_tensor_op_\w+_cycles_active)\.avg\."
                     r"pct_of_peak_sustained_active$")
# details page (section, metric) -> record field, where the raw page is not given
_DETAILS = {
    "Duration": "duration", "Compute (SM) Throughput": "sm_pct", "Memory Throughput": "memory_pct",
    "DRAM Throughput": "dram_pct", "Achieved Occupancy": "achieved_occupancy",
    "Theoretical Occupancy": "theoretical_occupancy", "Waves Per SM": "waves", "Registers Per Thread": "registers",
    "Block Limit Registers": "limit_registers", "Block Limit Shared Mem": "limit_shared_memory",
    "Block Limit Warps": "limit_warps", "Block Limit SM": "limit_blocks",
}
_DURATION_SCALE = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
                   "second": 1e9}
_LIMITS = ("limit_registers", "limit_shared_memory", "limit_warps", "limit_blocks")
_LIMIT_WORDS = {"limit_registers": "registers", "limit_shared_memory": "shared memory", "limit_warps": "warps",
                "limit_blocks": "blocks per SM"}


def _number(text: Any) -> float | None:
    if text is None:
        return None
    cleaned = str(text).strip().replace(",", "")
    if not cleaned or cleaned.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(cleaned)
    except ValueError:
        return None


def _shape(text: str) -> str:
    """ncu's "(64, 36, 1)" as advisor's "[64,36,1]"."""
    numbers = re.findall(r"\d+", str(text))
    return "[" + ",".join(numbers) + "]" if numbers else ""


def is_ncu_csv(head: str) -> bool:
    """Whether text starting with ``head`` is an ncu CSV page (raw or details)."""
    first = head.lstrip("\ufeff").splitlines()[0] if head.strip() else ""
    return '"Kernel Name"' in first and ('"Metric Name"' in first or "gpu__time_duration" in first
                                        or '"Block Size"' in first)


def read_ncu(paths: list[Path], notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The profiled kernels of one or more ncu exports (raw and details CSV pages, or an
    .ncu-rep read through ``ncu --import``), one record each, by ncu's kernel id. A file
    that is none of these, or not a regular file, or past MAX_EXPORT_BYTES, is a TraceError
    with one line. Figures that cannot be right (an unknown unit, a negative figure, a
    percentage outside 0-100, a kernel given twice) are refused, each kind said once in
    ``notes``."""
    records: dict[str, dict[str, Any]] = {}
    refused: dict[str, int] = {}
    for path in paths:
        if path.suffix == ".ncu-rep":
            _regular(path)
            for page in ("raw", "details"):
                _merge(records, read_ncu_text(_imported(path, page), str(path), refused))
            continue
        _merge(records, read_ncu_text(_read(path), str(path), refused))
    finished = [_finished(r, refused) for r in sorted(records.values(), key=lambda r: int(r["id"]))]
    if notes is not None and refused:
        notes.append("Nsight Compute export: " + "; ".join(f"{what} ({n})" for what, n in refused.items()))
    return finished


def _regular(path: Path) -> int:
    """The size of ``path``, a regular file within MAX_EXPORT_BYTES; else a TraceError
    (a device, a pipe or a folder would be read forever or block)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(f"{path}: not a regular file (an ncu export is a CSV page or an .ncu-rep file)")
    if st.st_size > MAX_EXPORT_BYTES:
        raise TraceError(f"{path}: {st.st_size / 2**20:,.0f} MiB, past the {MAX_EXPORT_BYTES >> 20} MiB advisor reads "
                         "from an ncu export (export the kernels you profiled: ncu --import R --csv --page raw)")
    return st.st_size


def _read(path: Path) -> str:
    _regular(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(MAX_EXPORT_BYTES + 1)
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(text) > MAX_EXPORT_BYTES:
        raise TraceError(f"{path}: past the {MAX_EXPORT_BYTES >> 20} MiB advisor reads from an ncu export")
    return text


def _refuse(refused: dict[str, int] | None, what: str) -> None:
    if refused is not None:
        refused[what] = refused.get(what, 0) + 1


def _imported(path: Path, page: str) -> str:
    ncu = shutil.which("ncu") or ("/usr/local/cuda/bin/ncu" if Path("/usr/local/cuda/bin/ncu").is_file() else None)
    if ncu is None:
        raise TraceError(f"{path}: an Nsight Compute report is read through `ncu --import`, and ncu is not installed "
                         "here; export it where it is: ncu --import REPORT --csv --page raw > raw.csv")
    try:
        done = subprocess.run([ncu, "--import", str(path), "--csv", "--page", page], capture_output=True, text=True,
                              timeout=IMPORT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TraceError(f"{path}: ncu --import failed ({exc})") from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise TraceError(f"{path}: ncu --import failed: {last[0][:200]}")
    return done.stdout


def read_ncu_text(text: str, where: str = "the ncu export",
                  refused: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """One CSV page's kernels, by ncu id (partial records; ``read_ncu`` finishes them).
    Rows whose ID is not a number of at most MAX_ID_DIGITS digits are not kernels; what
    is refused is counted in ``refused``."""
    text = text.lstrip("\ufeff")
    # ncu may print its own lines (==PROF== ...) before the CSV.
    start = text.find('"ID"')
    if start < 0 or not is_ncu_csv(text[start:start + 4096]):
        raise TraceError(f"{where}: not an Nsight Compute CSV page (ncu --import REPORT --csv --page raw|details)")
    limit = csv.field_size_limit()
    try:
        csv.field_size_limit(MAX_FIELD_CHARS)
        rows = list(csv.reader(io.StringIO(text[start:])))
    except csv.Error as exc:
        raise TraceError(f"{where}: not a readable CSV page ({str(exc)[:120]})") from None
    finally:
        csv.field_size_limit(limit)
    head = rows[0]
    column = {name: i for i, name in enumerate(head)}
    found = _details(rows, column, refused) if "Metric Name" in column else _raw(rows, column, refused)
    return found


def _base(row: list[str], column: dict[str, int]) -> dict[str, Any]:
    def get(name: str) -> str:
        i = column.get(name)
        return row[i] if i is not None and i < len(row) else ""

    name = get("Kernel Name")
    return {"id": get("ID").strip(), "kernel": name[:MAX_NAME_CHARS], "grid": _shape(get("Grid Size")[:200]),
            "block": _shape(get("Block Size")[:200]), "rules": [], "cut": len(name) > MAX_NAME_CHARS}


def _kernel_row(row: list[str], refused: dict[str, int] | None) -> bool:
    """Whether a CSV row is a kernel's: its first cell ncu's kernel ID."""
    if not row:
        return False
    first = row[0].strip()
    if not first.isdigit():
        return False
    if len(first) > MAX_ID_DIGITS:
        _refuse(refused, f"rows whose kernel ID has more than {MAX_ID_DIGITS} digits left out")
        return False
    return True


def _figure(field: str, value: float, refused: dict[str, int] | None) -> float | None:
    """``value`` where it can be a ``field``: finite, not negative, a percentage at most
    100 (a little over, as ncu rounds); else None, counted."""
    if not math.isfinite(value) or value < 0:
        _refuse(refused, "negative or infinite figures left out")
        return None
    if field in _PERCENT_FIELDS and value > 100.5:
        _refuse(refused, "percentages over 100 left out")
        return None
    return value


def _duration(value: float, unit: str, refused: dict[str, int] | None) -> float | None:
    """A duration in ns from ncu's figure and unit; None for a unit not known (said)."""
    scale = _DURATION_SCALE.get(unit.strip().lower())
    if scale is None:
        _refuse(refused, f"durations in a unit not known ({unit.strip()[:20]!r}) left out")
        return None
    checked = _figure("duration", value, refused)
    return None if checked is None else checked * scale


def _raw(rows: list[list[str]], column: dict[str, int], refused: dict[str, int] | None = None
         ) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    units = rows[1] if len(rows) > 1 and not (rows[1] and rows[1][0].strip().isdigit()) else None
    tensor = [i for name, i in column.items() if _TENSOR.match(name)]
    for row in rows[2 if units else 1:]:
        if not _kernel_row(row, refused):
            continue
        record = _base(row, column)
        if record["id"] in out:
            _refuse(refused, "kernels given twice on a page (the first kept)")
            continue
        for name, field in _RAW.items():
            i = column.get(name)
            value = _number(row[i]) if i is not None and i < len(row) else None
            if value is None:
                continue
            if field == "duration":
                unit = units[i] if units and i < len(units) else "ns"
                record["duration_ns"] = _duration(value, unit, refused)
            else:
                record[field] = _figure(field, value, refused)
        found = [_number(row[i]) for i in tensor if i < len(row)]
        found = [v for v in found if v is not None]
        if found:
            record["tensor_pct"] = _figure("tensor_pct", max(found), refused)
        out[record["id"]] = record
    return out


def _details(rows: list[list[str]], column: dict[str, int], refused: dict[str, int] | None = None
             ) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    seen: set[tuple[str, str, str]] = set()

    def cell(row: list[str], name: str) -> str:
        i = column.get(name)
        return row[i] if i is not None and i < len(row) else ""

    for row in rows[1:]:
        if not _kernel_row(row, refused):
            continue
        record = out.setdefault(row[0].strip(), _base(row, column))
        rule = cell(row, "Rule Name")
        if rule:
            description = " ".join(cell(row, "Rule Description").split())
            record["rules"].append({
                "name": rule, "type": cell(row, "Rule Type"), "section": cell(row, "Section Name"),
                "speedup": _number(cell(row, "Estimated Speedup")), "speedup_kind": cell(row, "Estimated Speedup Type"),
                "says": description.split(". ")[0][:300]})
            continue
        field = _DETAILS.get(cell(row, "Metric Name"))
        value = _number(cell(row, "Metric Value"))
        if field is None or value is None:
            continue
        key = (row[0].strip(), cell(row, "Section Name"), cell(row, "Metric Name"))
        if key in seen:
            _refuse(refused, "kernels given twice on a page (the first kept)")
            continue
        seen.add(key)
        if field == "duration":
            record["duration_ns"] = _duration(value, cell(row, "Metric Unit"), refused)
        else:
            record.setdefault(field, _figure(field, value, refused))
    return out


def _merge(into: dict[str, dict[str, Any]], found: dict[str, dict[str, Any]]) -> None:
    for key, record in found.items():
        have = into.setdefault(key, {"id": key, "rules": []})
        rules = have["rules"] + [r for r in record.get("rules", []) if r not in have["rules"]]
        # The first page given wins a figure both hold (the raw page's are unrounded).
        have.update({k: v for k, v in record.items() if v not in (None, "") and k != "rules"
                     and have.get(k) in (None, "")})
        have["rules"] = rules


def _finished(record: dict[str, Any], refused: dict[str, int] | None = None) -> dict[str, Any]:
    """Every field present (None where unknown), and the occupancy limiter named."""
    if record.get("cut"):
        _refuse(refused, f"kernel names longer than {MAX_NAME_CHARS:,} characters cut")
    fields = ("duration_ns", "sm_pct", "memory_pct", "dram_pct", "achieved_occupancy", "theoretical_occupancy",
              "waves", "registers", "tensor_pct", "fma_pct")
    out = {"id": record.get("id", ""), "kernel": record.get("kernel", ""), "grid": record.get("grid", ""),
           "block": record.get("block", ""), **{f: record.get(f) for f in fields}}
    limits = {k: record[k] for k in _LIMITS if record.get(k) is not None}
    out["limiter"] = _LIMIT_WORDS[min(limits, key=limits.__getitem__)] if limits else None
    out["rules"] = record.get("rules", [])
    return out


def exports_in(folder: Path) -> list[Path]:
    """The ncu exports a saved session's folder holds: ncu*.csv and *.ncu-rep."""
    return sorted([*folder.glob("ncu*.csv"), *folder.glob("*.ncu-rep")])


def attach(session: Any, paths: list[Path]) -> Any:
    """``session`` carrying the counters of ``paths`` (trace_metadata["ncu"]): the
    kernel_counters table reads them, as a pure function of the session."""
    notes: list[str] = []
    kernels = read_ncu([Path(p) for p in paths], notes)
    if not kernels:
        raise TraceError(f"{', '.join(str(p) for p in paths)}: no profiled kernel in the ncu export")
    metadata = {**session.meta.trace_metadata, NCU_KEY: {"source": ", ".join(str(p) for p in paths),
                                                         "kernels": kernels, "notes": notes}}
    collector = session.meta.collector.model_copy(update={"notes": [*session.meta.collector.notes, *notes]})
    session.meta = session.meta.model_copy(update={"trace_metadata": metadata, "collector": collector})
    return session
