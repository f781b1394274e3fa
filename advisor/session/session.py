"""The Session: one profile, whatever collected it, as pandas frames plus metadata.

Every collector and importer produces a Session and everything downstream (tables, rules,
reports) reads only a Session. The events frame has one schema for all sources, given by
``EVENT_COLUMNS``; a source that lacks a field leaves it at its missing value.

Times are integer nanoseconds (``start_ns``, ``end_ns``) on the source's own clock;
``meta.base_time_ns`` says where that clock's zero is where the source knows it. They are
never rounded to a coarser unit: a 0.4 us kernel stays 400 ns long.

Event kinds (``kind`` column), in the user's words:

    op              a framework operator (aten::conv2d, autograd::engine::...)
    python          a Python function frame (with_stack traces)
    annotation      a user range on the host (record_function, NVTX)
    gpu_annotation  a user range projected onto a GPU stream
    runtime         a CUDA runtime API call (cudaLaunchKernel, cudaMemcpy...)
    driver          a CUDA driver API call (cuLaunchKernel...)
    kernel          a GPU kernel
    memcpy          a GPU copy
    memset          a GPU memory set
    sync            a synchronisation record (the GPU side of a cudaStreamSynchronize...)
    step            one training/inference step (ProfilerStep#N or advisor's own)
    phase           a phase range (Dataloader, Forward, Backward, Optimization)
    sample          a host sample over the interval [start_ns, end_ns): ``value`` the
                    process's CPU use in cores (its children included), ``system_value``
                    the machine's CPU use 0..1, ``bytes`` the process's largest RSS read
                    (advisor.collect.sampler). Samples relate to no other row; they
                    measure the window but do not make it.
    stack           a sample of one Python thread's stack, taken at ``start_ns`` and
                    standing for the sampler's interval up to ``end_ns``: ``call_stack``
                    innermost frame first, ``category`` the process's role ("main" or
                    "loader worker"), ``step`` and ``phase`` where the main thread was
                    then (advisor.collect.stacks). Taken over the whole run, not only the
                    recorded steps; like samples they relate to no other row and do not
                    make the window.

Relations between rows are row ids (the ``id`` column, equal to the row's position):
``parent_op`` is the innermost op around a host event or the op that launched a GPU event,
``top_op`` the outermost one, ``launch`` the runtime/driver call that launched a GPU event.
-1 means none.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from advisor.errors import SessionError
from advisor.session.layout import EVENTS_FILE, META_FILE, SESSION_FORMAT, is_session_dir

if TYPE_CHECKING:  # pydantic's models, imported where a session is loaded from disk
    from advisor.session.meta import DeviceInfo, SessionMeta

__all__ = [
    "EVENTS_FILE",
    "EVENT_COLUMNS",
    "GPU_KINDS",
    "KINDS",
    "META_FILE",
    "PHASES",
    "RELATION_COLUMNS",
    "SESSION_FORMAT",
    "Session",
    "concat_events",
    "conform_events",
    "empty_events",
    "insert_unrelated",
    "is_session_dir",
    "one_of",
    "select_rows",
    "take_rows",
    "text",
]


KINDS = (
    "op",
    "python",
    "annotation",
    "gpu_annotation",
    "runtime",
    "driver",
    "kernel",
    "memcpy",
    "memset",
    "sync",
    "step",
    "phase",
    "sample",
    "stack",
)
GPU_KINDS = ("kernel", "memcpy", "memset")
PHASES = ("Dataloader", "Forward", "Backward", "Optimization", "Others")

# name -> (dtype, missing value). Strings are categoricals: names repeat a great deal and
# interning them is what keeps a million-event session small.
EVENT_COLUMNS: dict[str, tuple[str, Any]] = {
    "id": ("int64", -1),
    "name": ("category", ""),
    "kind": ("category", ""),
    "category": ("category", ""),  # the source's own category spelling
    "start_ns": ("int64", 0),
    "end_ns": ("int64", 0),
    "pid": ("int64", -1),
    "tid": ("int64", -1),
    "device": ("int64", -1),  # GPU ordinal; -1 for host events
    "stream": ("int64", -1),
    "correlation": ("int64", -1),
    "external_id": ("int64", -1),
    "launch": ("int64", -1),
    "parent_op": ("int64", -1),
    "top_op": ("int64", -1),
    "step": ("int64", -1),
    "phase": ("category", ""),
    "input_dims": ("category", ""),  # JSON text, as recorded
    "input_types": ("category", ""),
    "input_strides": ("category", ""),
    "concrete_inputs": ("category", ""),  # scalar arguments as recorded (stride, padding...)
    "comm": ("category", ""),  # a collective's record: [group name, group description, elements, dtype] as JSON
    "call_stack": ("category", ""),  # "file(line): function;..." innermost first, as Kineto writes it
    "bytes": ("int64", -1),
    "copy_kind": ("category", ""),  # HtoD, DtoH, DtoD, HtoH, PtoP
    "src_memory": ("category", ""),  # Pageable, Pinned, Device, Managed
    "dst_memory": ("category", ""),
    "grid": ("category", ""),
    "block": ("category", ""),
    "registers": ("int64", -1),
    "shared_memory": ("int64", -1),
    "flops": ("float64", np.nan),
    # ops: autograd's sequence number where grad mode was on (torch.profiler's "Sequence
    # number"); each autograd node a forward creates advances it by one
    "sequence": ("int64", -1),
    "value": ("float64", np.nan),  # sample rows: the process's CPU use over the interval, in cores
    "system_value": ("float64", np.nan),  # sample rows: the machine's CPU use over the interval, 0..1
}
RELATION_COLUMNS = ("launch", "parent_op", "top_op")  # columns holding row ids


def empty_events() -> pd.DataFrame:
    """An events frame with no rows and the full schema."""
    return conform_events(pd.DataFrame({c: [] for c in EVENT_COLUMNS}))


def conform_events(frame: pd.DataFrame) -> pd.DataFrame:
    """Give ``frame`` exactly the schema's columns, dtypes and missing values.

    Missing columns are added, extra ones dropped; ``id`` is reset to the row position.
    Columns already in shape are shared with ``frame``, not copied (copy-on-write keeps
    either frame's later changes to itself), and the columns are not consolidated into
    blocks: on a trace of millions of events each copy of the frame is hundreds of MB.
    """
    n = len(frame)
    index = frame.index
    if not (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1):
        frame = frame.reset_index(drop=True)
    out: dict[str, Any] = {}
    for column, (dtype, missing) in EVENT_COLUMNS.items():
        if column in frame.columns:
            values = frame[column]
            if dtype == "category":
                values = _as_text_category(values, missing)
            elif values.dtype == dtype and (dtype == "float64" or not values.isna().any()):
                pass
            elif dtype == "float64":
                values = pd.to_numeric(values, errors="coerce").astype("float64")
            else:
                values = pd.to_numeric(values, errors="coerce").fillna(missing).astype(dtype)
            out[column] = values
        elif dtype == "category":
            out[column] = pd.Categorical.from_codes(np.zeros(n, dtype="int8"), categories=[missing]) if n else \
                pd.Categorical([], categories=[missing])
        else:
            out[column] = np.full(n, missing, dtype=dtype)
    out["id"] = np.arange(n, dtype="int64")
    return pd.DataFrame(out, copy=False)


def text(column: pd.Series) -> np.ndarray:
    """A categorical column as a numpy object array of str, built per category (fast)
    rather than per row (``astype(str)`` on a million rows takes seconds)."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        column = column.astype("category")
    categories = np.asarray([str(c) for c in column.cat.categories] + [""], dtype=object)
    codes = column.cat.codes.to_numpy()
    return categories[np.where(codes >= 0, codes, len(categories) - 1)]


def one_of(column: pd.Series, values: Iterable[str]) -> np.ndarray:
    """Mask of the rows of a categorical column whose value is one of ``values``
    (a missing value reads as "", as in ``text``). Compared by code, not as text: ``text``
    and a string comparison per row take tens of milliseconds on a million rows."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        column = column.astype("category")
    wanted = set(values)
    codes = [i for i, c in enumerate(column.cat.categories) if str(c) in wanted]
    if "" in wanted:
        codes.append(-1)
    row_codes = column.cat.codes.to_numpy()
    if len(codes) == 1:
        return row_codes == codes[0]
    # A table of the wanted codes, looked up per row (a missing value, -1, is the last slot).
    wanted_code = np.zeros(len(column.cat.categories) + 1, dtype=bool)
    wanted_code[codes] = True
    return wanted_code[row_codes]


def start_order(start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Row order by start time, outer ranges first on ties (stable: rows that tie on both
    keep their order): ``np.lexsort((-end_ns, start_ns))``, computed faster.

    A trace's events come in long runs already in start order (a thread's ops, a stream's
    kernels), which a stable sort by start alone merges in one pass; lexsort sorts by the
    end first, with no such runs to use (1.4 s against 0.05 s on 5 M events). Only the rows
    that share a start with another are then put in order by their end."""
    order = np.argsort(start_ns, kind="stable")
    ordered = start_ns[order]
    tie = ordered[1:] == ordered[:-1]
    if tie.any():
        in_tie = np.zeros(len(order), dtype=bool)
        in_tie[1:] |= tie
        in_tie[:-1] |= tie
        rows = np.flatnonzero(in_tie)
        start_group = np.cumsum(np.concatenate(([True], ~tie)))[rows]
        tied = order[rows]
        order[rows] = tied[np.lexsort((-end_ns[tied], start_group))]
    return order


def concat_events(frames: list[pd.DataFrame], *, by_start: bool = False, conformed: bool = False) -> pd.DataFrame:
    """Stack event frames, keeping categorical columns categorical (a plain pd.concat
    turns categoricals with different categories into slow object columns). With
    ``by_start`` the rows come in start order (``start_order``), put in order a column at a
    time, so the stacked frame is never held twice. ``conformed``: the frames are in the
    schema already (conform_events), as attribution's are; else they are put in it first."""
    frames = frames if conformed else [conform_events(f) for f in frames]
    order = None
    if by_start:
        order = start_order(np.concatenate([f["start_ns"].to_numpy() for f in frames]),
                            np.concatenate([f["end_ns"].to_numpy() for f in frames]))
    out = {}
    for column, (dtype, _missing) in EVENT_COLUMNS.items():
        parts = [f[column] for f in frames]
        if dtype == "category":
            values = _stacked_categories([p.array for p in parts])
        else:
            values = np.concatenate([p.to_numpy() for p in parts])
        out[column] = values if order is None else values.take(order)
    out["id"] = np.arange(len(out["id"]), dtype="int64")
    return pd.DataFrame(out, copy=False)  # in shape already: each column built once, not consolidated


def _stacked_categories(arrays: list[pd.Categorical]) -> pd.Categorical:
    """The categoricals one after another, as union_categoricals stacks them: the first's
    categories, then those the others add. Where they add none (a few rows stacked under
    many, the usual case), their codes are mapped onto the first's categories, without
    union_categoricals' unions of categories (half the time of stacking attribution's
    inferred phases under a trace's events)."""
    from pandas.api.types import union_categoricals

    first = arrays[0]
    codes = [first.codes]
    for other in arrays[1:]:
        if not len(other.categories):
            codes.append(np.full(len(other), -1, dtype=first.codes.dtype))
            continue
        where = first.categories.get_indexer(other.categories)
        if (where < 0).any():
            break
        codes.append(np.where(other.codes >= 0, where[other.codes], -1))
    else:
        return pd.Categorical.from_codes(np.concatenate(codes), dtype=first.dtype)
    # An empty column's categories may be of another dtype (object) than a filled one's
    # (str); union_categoricals wants one dtype.
    kinds = {a.categories.dtype for a in arrays if len(a.categories)}
    if len(kinds) == 1:
        kind = kinds.pop()
        arrays = [a if a.categories.dtype == kind else a.set_categories(a.categories.astype(kind)) for a in arrays]
    return union_categoricals(arrays)


def select_rows(events: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """The rows of a conformed events frame at ``rows`` (a mask or row positions), as a
    frame of their own. A numeric column that holds only its missing value on those rows
    (a GPU field on the host's rows, a sample's CPU use anywhere else) is that value
    broadcast, not a copy per row: on a large trace the frames of one kind of event that
    the tables share would otherwise hold hundreds of MB of -1 and NaN. The frame is
    read-only in those columns, as a frame shared by several readers should be."""
    positions = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows)
    out: dict[str, Any] = {}
    for column in events.columns:
        spec = EVENT_COLUMNS.get(column)
        series = events[column]
        if spec is None:
            out[column] = series.to_numpy()[positions]
            continue
        if spec[0] == "category":
            out[column] = series.array.take(positions)
            continue
        values = series.to_numpy()[positions]
        missing = spec[1]
        blank = np.isnan(values).all() if spec[0] == "float64" else bool((values == missing).all())
        out[column] = np.broadcast_to(values.dtype.type(missing), values.shape) if blank and len(values) else values
    index = events.index[positions]
    return pd.DataFrame(out, index=index, copy=False)


def insert_unrelated(events: pd.DataFrame, extra: pd.DataFrame) -> pd.DataFrame:
    """``events`` (attributed: rows by start, outer first on ties) with the rows of
    ``extra``, which point at no other row (host samples), placed in start order; the
    relation columns are renumbered to the rows' new positions, so attribution need not
    run again."""
    if not len(extra):
        return events
    extra = conform_events(extra)
    for column in RELATION_COLUMNS:
        extra[column] = -1
    combined = concat_events([events, extra])
    # A stable sort: rows already in order keep their order among themselves.
    return take_rows(combined, start_order(combined["start_ns"].to_numpy(), combined["end_ns"].to_numpy()))


def take_rows(events: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """The rows of an attributed events frame at positions ``rows`` (each at most once),
    in that order, their ids and relation columns renumbered to the new positions; a
    relation to a row left out becomes -1."""
    position = np.full(len(events), -1, dtype="int64")
    position[rows] = np.arange(len(rows), dtype="int64")
    out = events.take(rows).reset_index(drop=True)
    for column in RELATION_COLUMNS:
        ids = out[column].to_numpy()
        out[column] = np.where(ids >= 0, position[np.maximum(ids, 0)], -1)
    out["id"] = np.arange(len(out), dtype="int64")
    return out


def _as_text_category(values: pd.Series, missing: str) -> pd.Series:
    """A categorical of strings with ``missing`` for absent values. Categoricals of
    strings pass through untouched: converting a million rows row by row is what made
    this slow, and most frames reaching here are already in shape."""
    # Categories of a string dtype are strings without looking at them one by one (each
    # a Python object made from Arrow memory); codes of -1 are the absent values.
    if isinstance(values.dtype, pd.CategoricalDtype) and (
        len(values.cat.categories) == 0 or isinstance(values.cat.categories.dtype, pd.StringDtype)
        or all(isinstance(c, str) for c in values.cat.categories[:50])
    ):
        if (values.cat.codes.to_numpy() < 0).any():
            if missing not in values.cat.categories:
                values = values.cat.add_categories([missing])
            values = values.fillna(missing)
        return values
    values = values.astype("object").where(values.notna(), missing)
    return values.astype(str).astype("category")


def _copies_said(events: pd.DataFrame) -> tuple[pd.DataFrame, int, list[str]]:
    """A saved session's events with exact copies of a row read once, how many, and the
    notes that say so and count near-copies (advisor.session.copies), as a trace's reader
    says them."""
    from advisor.session.copies import NEAR_NS, near_copies, without_copies

    kept, copies = without_copies(events, RELATION_COLUMNS)
    notes = []
    if copies:
        notes.append(f"{copies:,} rows of the saved session are copies of another, identical in every field (a "
                     "session written twice, or two joined?): each was read once.")
    near = near_copies(kept["start_ns"].to_numpy(), kept["end_ns"].to_numpy(),
                       *(kept[c].cat.codes.to_numpy() for c in ("name", "kind")),
                       kept["pid"].to_numpy(), kept["tid"].to_numpy())
    if near:
        notes.append(f"{near:,} events are near-copies of another: the same name, thread and duration, starting "
                     f"within {NEAR_NS} ns (a profile joined with a shifted copy of itself?); no profiler writes such "
                     "pairs, and the figures count both.")
    return kept, copies, notes


class Session:
    """A profile: ``meta`` plus the ``events`` frame (see EVENT_COLUMNS)."""

    def __init__(self, meta: SessionMeta, events: pd.DataFrame, *, window: tuple[int, int] | None = None):
        self.meta = meta
        self.events = events
        # The steady window the step model chose (advisor.step), where it chose one: the
        # window every later stage judges. Derived, never saved.
        self.steady_window = window
        # The step model (advisor.step) that made this session, where one did: for a caller
        # that holds only the steady session (advisor's own stages pass the model itself).
        self.step_model = None

    def __repr__(self) -> str:
        return f"Session(source={self.meta.source!r}, events={len(self.events)})"

    # -- derived facts every table needs -------------------------------------------------

    def steps(self) -> pd.DataFrame:
        """One row per step: step number, start_ns, end_ns (ordered by start)."""
        ev = self.events
        steps = ev[ev["kind"] == "step"]
        out = steps[["step", "start_ns", "end_ns", "name"]].sort_values("start_ns")
        return out.reset_index(drop=True)

    def window(self) -> tuple[int, int]:
        """The profiled window (docs/design.md): first step start to last step end; without
        steps, first event start to last event end. Host samples cover the whole run,
        start-up included, so they count only where there is nothing else. A session the
        step model made (advisor.step) has the steady window it chose."""
        if self.steady_window is not None:
            return self.steady_window
        steps = self.steps()
        if len(steps):
            return int(steps["start_ns"].min()), int(steps["end_ns"].max())
        ev = self.events
        if not len(ev):
            return 0, 0
        start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
        measured = (ev["kind"] != "sample").to_numpy()
        if measured.any():
            start, end = start[measured], end[measured]
        return int(start.min()), int(end.max())

    def gpu_devices(self) -> list[DeviceInfo]:
        return [d for d in self.meta.devices if d.kind == "gpu"]

    # -- persistence ---------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the session as a folder: session.json (metadata) + events.parquet."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.events.to_parquet(folder / EVENTS_FILE, index=False)
        (folder / META_FILE).write_text(self.meta.json_text(indent=2), encoding="utf-8")
        return folder

    @classmethod
    def load(cls, path: str | Path) -> "Session":
        """The session saved in the folder ``path``, checked as it is read (advisor.session.saved):
        a folder that is not one, or whose files are damaged or edited into something no profile
        is, raises SessionError naming what is wrong; nothing is coerced."""
        from advisor.session.saved import Schema, read_events, read_meta, session_files

        folder = Path(path)
        if not folder.is_dir() or not (folder / META_FILE).exists():
            raise SessionError(f"{folder} is not an advisor session (no {META_FILE} in it)")
        meta_path, events_path = session_files(folder)
        raw = read_meta(meta_path)
        if not isinstance(raw, dict) or raw.get("format") != SESSION_FORMAT:
            raise SessionError(f"{folder} is not an advisor session of format {SESSION_FORMAT}")
        from pydantic import ValidationError

        from advisor.session.meta import SessionMeta

        try:
            meta = SessionMeta.model_validate(raw)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "the metadata"
            raise SessionError(f"{meta_path} is damaged: {where}: {error['msg']}") from None
        except (ValueError, RecursionError) as exc:
            raise SessionError(f"{meta_path} is damaged: {' '.join(str(exc).split())[:200]}") from None
        schema = Schema(EVENT_COLUMNS, KINDS, RELATION_COLUMNS)
        events = conform_events(read_events(events_path, schema))
        said = _copies_said(events)
        if said[1]:
            events = said[0]
        if said[2]:
            collector = meta.collector.model_copy(update={"notes": [*meta.collector.notes, *said[2]]})
            meta = meta.model_copy(update={"collector": collector})
        return cls(meta, events)
