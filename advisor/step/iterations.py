"""Iterations found in a profile that marks no step: what repeats, and what shows it.

Many real traces carry no ``ProfilerStep#N`` ranges: a whole run wrapped in one
``torch.profiler.profile()``, a benchmark calling one op N times, a serving worker, the
first calls of a compiled model. A step is then what repeats on the loop's thread, found
from the strongest signal the trace holds, in this order:

    dataloader       each read of a DataLoader (``enumerate(DataLoader)...__next__``) starts one
    optimizer        each optimizer step (``Optimizer.step#...``) ends one
    module calls     each top-level call of the model (``nn.Module: ...``) starts one, unless the
                     per-iteration syncs disagree (a logits processor called 1-4 times a step)
    annotations      a user range repeated once an iteration (``record_function("train_step")``,
                     ``## forward ##``, a compiled region's range), its numbers ignored
    graph replays    each graph launch starts one
    syncs            each wait on the device at a steady cadence ends one
    op sequence      the same sequence of the loop's top-level calls recurring (a benchmark
                     calling one op N times is N iterations)
    kernel sequence  the same sequence of GPU kernels recurring, where the host shows none

A signal's marks become iterations of the loop's own calls: the calls between two marks
are one iteration, and the first and last take as many calls as the others (the set-up
before the first and the teardown after the last are not iterations). Where the host runs
ahead of the device (no wait inside the loop: a benchmark launching its calls back to back),
an iteration's step is its work's time on the device, and its host calls stay its own
(``Iterations.host_spans``) whenever they ran.

A recurring sequence is only an iteration where it is the whole work: a run of identical
layers inside one pass recurs too, but the pass goes on after the last of them (its head,
its loss); such a run is not taken for iterations. The loop's calls are read at the level
where the loop runs: single ranges wrapping the run (``<module>``, ``main``, a training
function, one annotation around everything) are looked inside, a module's call never (its
layers are not iterations).

``find_iterations`` is a pure function of an attributed Session's events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.session import GPU_KINDS, calls, one_of, text
from advisor.session.attribute import name_matches
from advisor.units import format_ns

__all__ = ["MIN_ITERATIONS", "Iterations", "Level", "find_iterations", "loop_level", "outermost", "regularity"]

# Iterations to find before they are believed.
MIN_ITERATIONS = 3
# Per-iteration syncs: their intervals may vary by this much (coefficient of variation) and
# still be one iteration each.
SYNC_CADENCE_CV = 0.5
# Two step sources agree where their counts differ by at most one and their mean steps by
# at most this share.
AGREE_SHARE = 0.25
# A single range holding this share of its level's span wraps the run: the loop is inside it.
WRAPPER_SHARE = 0.8
# A recurring sequence: this share of its blocks the same (the others of a like length: a
# logging iteration with one more call), covering this share of the level's calls, host
# time or device work.
SAME_BLOCKS = 0.6
MIN_COVER = 0.5
# ... and not a run of layers: each block's work within this factor of the others', the
# work after the last (the pass going on) under this share of a block's.
BLOCK_WORK_SPREAD = 3.0
TAIL_SHARE = 0.5
# ... recurring at a steady pace: this share of the blocks within a factor two of their median.
REGULAR_SHARE = 2 / 3

_LOADER_NEXT = re.compile(r"^enumerate\(DataLoader\).*__next__")
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
_MODULE_CALL = re.compile(r"^nn\.Module: ")
# A module's call in Python frames: never looked inside for iterations.
_MODULE_FRAME = re.compile(r"^nn\.Module: |torch/nn/modules/module\.py\(\d+\): _(wrapped_)?call_impl$")
# The profiler's own ranges and advisor's marks: not the loop's calls.
_NOT_THE_LOOP = re.compile(r"^(ProfilerStep#|advisor::|Iteration Start|PyTorch Profiler)|torch/profiler/|"
                           r"torch/autograd/profiler\.py")
# Numbers in a range's name (a request id, a sequence length, an iteration count) vary
# between iterations of the same range.
_NUMBERS = re.compile(r"\d+")


@dataclass(frozen=True)
class Iterations:
    """Steps found from what repeats: their times, the signal and how regular they are."""

    steps: pd.DataFrame  # step, start_ns, end_ns
    source: str  # the signal (module docstring)
    how: str  # in words
    # Where the host runs ahead of the device: each step's host calls, by when they ran
    # (step, start_ns, end_ns); None where the host's time and the device's agree.
    host_spans: pd.DataFrame | None = None


def find_iterations(ev: pd.DataFrame, main: tuple[int, int] | None) -> Iterations | None:
    """Iterations of the loop run on ``main`` (see the module docstring); None where
    nothing repeats often enough. The device's kernels are read only where the host shows
    no calls: inside one pass the layers recur on the device too."""
    level = loop_level(ev, main) if main is not None else None
    found = _host_iterations(ev, main, level) if level is not None and len(level) else _kernel_iterations(ev)
    if found is None:
        return None
    steps, source, how = found
    steps = steps[steps["end_ns"] > steps["start_ns"]].reset_index(drop=True)
    if len(steps) < MIN_ITERATIONS - 1:
        return None
    steps = steps.assign(step=np.arange(len(steps), dtype=np.int64))
    host = None
    if "host_start_ns" in steps.columns:
        host = steps[["step", "host_start_ns", "host_end_ns"]].rename(
            columns={"host_start_ns": "start_ns", "host_end_ns": "end_ns"})
        how += "; the host runs ahead of the device, so each step is its work's time on the device"
    return Iterations(steps[["step", "start_ns", "end_ns"]], source, how, host)


def regularity(steps: pd.DataFrame) -> str:
    """How regular steps are, in words: their count, median and spread."""
    took = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype=np.float64)
    if not len(took):
        return ""
    return (f"{len(took)} steady, median {format_ns(float(np.median(took)))}, their coefficient of variation "
            f"{_spread(steps) * 100:.0f}%")


def _spread(steps: pd.DataFrame) -> float:
    took = (steps["end_ns"] - steps["start_ns"]).to_numpy(dtype=np.float64)
    return float(took.std() / took.mean()) if len(took) and took.mean() > 0 else 0.0


# -- the loop's level ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    """The loop's calls at the level the loop runs: rows, in start order, with their times
    and names."""

    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray
    names: np.ndarray  # object: each call's name
    shapes: np.ndarray  # object: an operator's recorded input shapes, "" where none
    site: np.ndarray  # bool: a Python frame or a user range (it names where the script called it)

    def __len__(self) -> int:
        return len(self.rows)

    def symbols(self, numbers: bool = True) -> np.ndarray:
        """Each call as an integer, equal names equal (numbers left out where asked)."""
        names = self.names if numbers else np.array([_NUMBERS.sub("#", n) for n in self.names], dtype=object)
        return pd.factorize(names)[0].astype(np.int64)

    def calls(self) -> np.ndarray:
        """Each call as an integer, equal where the name and the recorded shapes are: the
        same operator on other shapes (the next layer of a network) is another call."""
        return pd.factorize(self.names + "\x00" + self.shapes)[0].astype(np.int64)

    def at(self, times: np.ndarray) -> np.ndarray:
        """The index of the call holding each time, else of the first call after it."""
        i = np.searchsorted(self.start, times, side="right") - 1
        inside = (i >= 0) & (self.end[np.maximum(i, 0)] > times)
        return np.where(inside, i, i + 1)


def loop_level(ev: pd.DataFrame, main: tuple[int, int], marks: np.ndarray | None = None) -> Level | None:
    """The loop's calls: the outermost ranges of ``main`` (ops, annotations, Python frames),
    looked inside while one of them wraps the run: holds most of its level's span, or two
    of a signal's ``marks`` (times) or more (the loop runs inside it, after a set-up)."""
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    on_main = (ev["pid"].to_numpy() == main[0]) & (ev["tid"].to_numpy() == main[1])
    mask = on_main & one_of(ev["kind"], ("op", "annotation", "python")) & ~name_matches(ev["name"], _NOT_THE_LOOP)
    rows = np.flatnonzero(mask)
    if not len(rows):
        return None
    rows = rows[np.lexsort((-(end[rows] - start[rows]), start[rows]))]
    first = start[rows]
    wrapper = _wrappers(ev, rows)
    marks = np.sort(np.asarray(marks, dtype=np.int64)) if marks is not None else np.zeros(0, dtype=np.int64)
    level = outermost(rows, start, end, ordered=True)
    for _ in range(64):  # a wrapper inside a wrapper: <module>, main, train
        if len(level) == 0:
            break
        took = end[level] - start[level]
        span = int(end[level].max() - start[level].min())
        held = np.searchsorted(marks, end[level], side="left") - np.searchsorted(marks, start[level], side="left")
        # A range that recurs at its level is an iteration, however long (a first one that
        # compiles), not a wrapper.
        keys = pd.Series([_NUMBERS.sub("#", n) for n in text(ev["name"].iloc[level])])
        alone = ~keys.duplicated(keep=False).to_numpy()
        opened = wrapper[level] & alone & ((took >= WRAPPER_SHARE * max(span, 1)) | (held >= 2))
        if span <= 0 or not opened.any():
            break
        row = int(level[np.flatnonzero(opened)[np.argmax(took[opened])]])
        a, b = np.searchsorted(first, [start[row], end[row]], side="left")
        inside = rows[a:b]
        inside = inside[(end[inside] <= end[row]) & (inside != row)]
        kids = outermost(inside, start, end, ordered=True)
        if not len(kids):
            wrapper[row] = False
            continue
        level = np.concatenate([level[level != row], kids])
        level = level[np.lexsort((-(end[level] - start[level]), start[level]))]
    names = text(ev["name"].iloc[level])
    shapes = text(ev["input_dims"].iloc[level]) if "input_dims" in ev else np.full(len(level), "", dtype=object)
    kind = ev["kind"].iloc[level]
    site = one_of(kind, ("python", "annotation")) | (one_of(kind, ("op",)) & _ranges(names))
    return Level(level, start[level], end[level], names, shapes, site)


def _ranges(names: np.ndarray) -> np.ndarray:
    """Which operator rows are ranges a program named (record_function: a compiled region,
    ``CompiledFunction``, ``## forward ##``), not operators (``aten::mm``, ``vllm::...``):
    an operator's name is a namespace and a name, joined by ``::``."""
    return np.array(["::" not in n for n in names], dtype=bool)


def _wrappers(ev: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Per event row: whether it may wrap the loop (a Python frame or a user range that is
    no module's call, no loop mark)."""
    out = np.zeros(len(ev), dtype=bool)
    kind_ok = one_of(ev["kind"], ("python", "annotation"))
    marks = name_matches(ev["name"], _MODULE_FRAME) | name_matches(ev["name"], _LOADER_NEXT) \
        | name_matches(ev["name"], _OPTIMIZER_STEP)
    out[rows] = (kind_ok & ~marks)[rows]
    return out


def outermost(rows: np.ndarray, start: np.ndarray, end: np.ndarray, *, ordered: bool = False) -> np.ndarray:
    """The rows (in start order) not inside an earlier one of them; ``ordered``: ``rows``
    are in start order already, the longer first among equal starts."""
    if not len(rows):
        return rows
    if not ordered:
        rows = rows[np.lexsort((-(end[rows] - start[rows]), start[rows]))]
    reach = np.maximum.accumulate(end[rows])
    inside = np.zeros(len(rows), dtype=bool)
    inside[1:] = start[rows][1:] < reach[:-1]
    return rows[~inside]


# -- host signals --------------------------------------------------------------------------------


def _host_iterations(ev: pd.DataFrame, main: tuple[int, int], level: Level) -> tuple[pd.DataFrame, str, str] | None:
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    on_main = (ev["pid"].to_numpy() == main[0]) & (ev["tid"].to_numpy() == main[1])
    ranges = on_main & one_of(ev["kind"], ("annotation", "op", "python"))

    def from_marks(marks: np.ndarray, *, ends: bool) -> pd.DataFrame:
        level = loop_level(ev, main, marks)
        return _steps([], []) if level is None else _from_marks(ev, level, marks, ends=ends)

    loader = outermost(np.flatnonzero(ranges & name_matches(ev["name"], _LOADER_NEXT)), start, end)
    if len(loader) >= MIN_ITERATIONS:
        name = text(ev["name"].iloc[loader[:1]])[0]
        return (from_marks(start[loader], ends=False), "dataloader",
                f"each read of the data loader ({name}) starts a step")
    optimizer = outermost(np.flatnonzero(ranges & name_matches(ev["name"], _OPTIMIZER_STEP)), start, end)
    if len(optimizer) >= MIN_ITERATIONS:
        return from_marks(end[optimizer] - 1, ends=True), "optimizer", "each optimizer step ends a step"
    syncs = _sync_steps(ev, on_main, end)
    modules = outermost(np.flatnonzero(ranges & name_matches(ev["name"], _MODULE_CALL)), start, end)
    top = _most_called(ev, modules)
    if top is not None:
        name, marks = top
        steps = from_marks(start[marks], ends=False)
        how = f"each top-level call of {name.removeprefix('nn.Module: ')} starts a step"
        if syncs is None:
            return steps, "module calls", how
        # The device's own rhythm decides: a module called a varying number of times per
        # iteration (a logits processor, a sampler) cuts steps in the wrong place.
        if _agree(steps, syncs):
            return steps, "module calls", how + f", in step with the {len(syncs)} iterations the syncs show"
        return syncs, "syncs", (f"each wait on the device ends a step: the top-level calls of "
                                f"{name.removeprefix('nn.Module: ')} ({len(steps)} steps) disagreed with the "
                                f"{len(syncs)} iterations the per-iteration syncs show")
    annotated = _repeated_annotation(ev, level)
    if annotated is not None:
        name, marks = annotated
        return (_from_marks(ev, level, start[marks], ends=False), "annotations",
                f"each user range {name!r} starts a step")
    graphs = np.flatnonzero(on_main & one_of(ev["kind"], ("runtime", "driver"))
                            & name_matches(ev["name"], calls.GRAPH_LAUNCH))
    if len(graphs) >= MIN_ITERATIONS:
        return from_marks(start[graphs], ends=False), "graph replays", "each graph launch starts a step"
    if syncs is not None:
        return syncs, "syncs", "each wait on the device (a synchronize once an iteration) ends a step"
    found = _recurring(level.calls(), _work_of_level(ev, level), level.start, level.end, sites=level.site,
                       shaped=level.shapes != "")
    if found is None:
        return None
    heads, unit, _ = found
    what = _unit_words(level.names[heads[0]:heads[0] + unit])
    return (_from_marks(ev, level, level.start[heads], ends=False), "op sequence",
            f"the same sequence of the loop's top-level calls recurs ({what}), each recurrence a step")


def _most_called(ev: pd.DataFrame, modules: np.ndarray) -> tuple[str, np.ndarray] | None:
    """The top-level module called most (the earliest called, among equals): its name and
    calls; None where none is called MIN_ITERATIONS times."""
    if len(modules) < MIN_ITERATIONS:
        return None
    labels = text(ev["name"].iloc[modules])
    values, first, counts = np.unique(labels, return_index=True, return_counts=True)
    best = np.lexsort((first, -counts))[0]
    if counts[best] < MIN_ITERATIONS:
        return None
    return str(values[best]), modules[labels == values[best]]


def _repeated_annotation(ev: pd.DataFrame, level: Level) -> tuple[str, np.ndarray] | None:
    """A user range at the loop's level repeated MIN_ITERATIONS times or more (its numbers
    ignored: ``execute_3`` and ``execute_4`` are one range): the most repeated, the first
    of each iteration among equals. Its name and rows. A range a program named is one
    whichever category the profiler filed it under (``Torch-Compiled Region: 0/0`` is an
    operator on a CPU trace, an annotation on a GPU one); a Python frame is no range."""
    kind = ev["kind"].iloc[level.rows]
    kinds = one_of(kind, ("annotation",)) | (one_of(kind, ("op",)) & _ranges(level.names))
    if not kinds.any():
        return None
    keys = np.array([_NUMBERS.sub("#", n) for n in level.names[kinds]], dtype=object)
    values, first, counts = np.unique(keys, return_index=True, return_counts=True)
    best = np.lexsort((first, -counts))[0]
    if counts[best] < MIN_ITERATIONS:
        return None
    rows = level.rows[kinds][keys == values[best]]
    return str(level.names[kinds][first[best]]), rows


def _sync_steps(ev: pd.DataFrame, on_main: np.ndarray, end: np.ndarray) -> pd.DataFrame | None:
    """Steps from the loop's waits on the device: where the main thread synchronizes (a
    device, stream or event synchronize) at a steady cadence, at least MIN_ITERATIONS + 1
    times, each wait ends an iteration. None where it does not."""
    pattern = calls.DEVICE_SYNC.pattern + "|" + calls.STREAM_SYNC.pattern + "|" + calls.EVENT_SYNC.pattern
    rows = np.flatnonzero(on_main & one_of(ev["kind"], ("runtime", "driver"))
                          & name_matches(ev["name"], re.compile(pattern)))
    if len(rows) < MIN_ITERATIONS + 1:
        return None
    ends = np.sort(end[rows])
    gaps = np.diff(ends)
    if not len(gaps) or gaps.mean() <= 0 or gaps.std() > SYNC_CADENCE_CV * gaps.mean():
        return None
    return pd.DataFrame({"step": np.arange(len(ends) - 1, dtype=np.int64), "start_ns": ends[:-1], "end_ns": ends[1:]})


def _agree(steps: pd.DataFrame, other: pd.DataFrame) -> bool:
    mine = float((steps["end_ns"] - steps["start_ns"]).mean())
    theirs = float((other["end_ns"] - other["start_ns"]).mean())
    return abs(len(steps) - len(other)) <= 1 and theirs > 0 and abs(mine - theirs) <= AGREE_SHARE * theirs


# -- marks to iterations -------------------------------------------------------------------------


def _from_marks(ev: pd.DataFrame, level: Level, marks: np.ndarray, *, ends: bool) -> pd.DataFrame:
    """Iterations from a signal's marks (times inside or before the loop's calls): each
    starts (``ends``: ends) with the call holding a mark. The first before the first mark
    (``ends``) or the last after the last (else) takes as many calls as the others, from
    the calls that occur in them: the set-up before and the teardown after are not
    iterations. Each then starts where its device work does, where the device lags."""
    at = np.unique(level.at(np.sort(np.asarray(marks, dtype=np.int64))))
    at = at[at < len(level)]
    if len(at) < 2:
        return _steps([], [])
    sizes = np.diff(at)
    size = int(np.median(sizes))
    symbols = level.symbols(numbers=False)
    seen = set(symbols[at[0]:at[-1]].tolist()) if not ends else set(symbols[at[0] + 1:at[-1] + 1].tolist())
    if ends:
        # Iteration i is the calls after mark i - 1 up to mark i; the first reaches back
        # over calls the others make, as many as one of them holds.
        first = int(at[0])
        while first > 0 and at[0] - first + 1 < size and symbols[first - 1] in seen:
            first -= 1
        firsts = np.concatenate([[first], at[:-1] + 1])
        lasts = at
    else:
        last = int(at[-1])
        while last + 1 < len(level) and last - at[-1] + 1 < size and symbols[last + 1] in seen:
            last += 1
        firsts = at
        lasts = np.concatenate([at[1:] - 1, [last]])
    begin = level.start[firsts]
    finish = np.maximum.accumulate(level.end)[lasts]
    finish[:-1] = begin[1:]  # one iteration runs to the next: the time between them is the loop's
    # The first (``ends``) or last iteration takes as long as the others where nothing
    # else the loop calls comes first: its work on other threads (backward on autograd's)
    # and the device, and a wait at its end, hold no call at this level.
    typical = int(np.median(np.diff(begin))) if len(begin) > 2 else int(finish[0] - begin[0])
    if ends:
        before = int(level.end[firsts[0] - 1]) if firsts[0] > 0 else _first_event(ev)
        begin[0] = min(int(begin[0]), max(int(finish[0]) - typical, before))
    else:
        after = int(level.start[lasts[-1] + 1]) if lasts[-1] + 1 < len(level) else _last_event(ev)
        finish[-1] = max(int(finish[-1]), min(int(begin[-1]) + typical, after))
    moved, moved_finish = _device_paced(ev, begin, finish)
    out = _steps(moved, moved_finish)
    if moved is not begin:
        # The host's last iteration runs on to the end of its device work: the wait for the
        # queued work (a synchronize after the loop) is the last iteration's.
        out["host_start_ns"], out["host_end_ns"] = begin, np.append(finish[:-1], moved_finish[-1])
    return out


def _first_event(ev: pd.DataFrame) -> int:
    """When the host's first recorded call began."""
    host = one_of(ev["kind"], _HOST_KINDS)
    return int(ev["start_ns"].to_numpy()[host].min()) if host.any() else 0


def _last_event(ev: pd.DataFrame) -> int:
    """When the host's last operator or range ended, on any thread (backward on autograd's):
    not a runtime call (a last synchronize, the profiler's own as it stops, waits for the
    device after the loop), nor the device's work (a step is the host's, as a profiler's
    own step ranges are)."""
    host = one_of(ev["kind"], ("op", "annotation", "python"))
    return int(ev["end_ns"].to_numpy()[host].max()) if host.any() else 0


_HOST_KINDS = ("op", "annotation", "python", "runtime", "driver")


def _device_paced(ev: pd.DataFrame, begin: np.ndarray, finish: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Iterations found on the host, on the device's clock where the host runs ahead
    (nothing in the loop waits for the device): where the device starts most iterations'
    work only after the host has begun the next, each iteration's step runs from its first
    device work to the next's, the first from its host start, the last to its device
    work's end; the host's calls keep their iteration (``host_start_ns`` / ``host_end_ns``
    in the steps), whenever they ran. A device that lags by less than an iteration leaves
    them as they are, as a profiler's own step ranges would be (the same arrays back)."""
    gpu = one_of(ev["kind"], GPU_KINDS)
    launch = ev["launch"].to_numpy()
    rows = np.flatnonzero(gpu & (launch >= 0))
    if not len(rows) or len(begin) < 2:
        return begin, finish
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    launched = start[launch[rows]]
    which = np.searchsorted(begin, launched, side="right") - 1  # the iteration each was launched in
    inside = (which >= 0) & (launched < finish[np.maximum(which, 0)])
    rows, which = rows[inside], which[inside]
    n = len(begin)
    never = np.iinfo(np.int64).max
    first_start = np.full(n, never, dtype=np.int64)
    np.minimum.at(first_start, which, start[rows])
    last_end = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last_end, which, end[rows])
    has = first_start < never
    behind = has[:-1] & (first_start[:-1] >= begin[1:])
    if behind.sum() <= 0.5 * max(int(has[:-1].sum()), 1):
        return begin, finish
    moved = np.maximum.accumulate(np.where(has, np.maximum(begin, first_start), begin))
    moved[0] = begin[0]
    return moved, np.append(moved[1:], max(int(finish[-1]), int(last_end.max())))


def _steps(begin, finish) -> pd.DataFrame:
    begin = np.asarray(begin, dtype=np.int64)
    finish = np.asarray(finish, dtype=np.int64)
    return pd.DataFrame({"step": np.arange(len(begin), dtype=np.int64), "start_ns": begin, "end_ns": finish})


# -- recurring sequences -------------------------------------------------------------------------


def _work_of_level(ev: pd.DataFrame, level: Level) -> np.ndarray:
    """Each call's work: the device time of the work launched inside it where the device
    was measured, else its own host time."""
    gpu = one_of(ev["kind"], GPU_KINDS)
    launch = ev["launch"].to_numpy()
    rows = np.flatnonzero(gpu & (launch >= 0))
    if not len(rows):
        return (level.end - level.start).astype(np.float64)
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    at = np.searchsorted(level.start, start[launch[rows]], side="right") - 1
    inside = (at >= 0) & (start[launch[rows]] < level.end[np.maximum(at, 0)])
    work = np.zeros(len(level), dtype=np.float64)
    np.add.at(work, at[inside], (end[rows] - start[rows])[inside].astype(np.float64))
    return work


def _recurring(symbols: np.ndarray, work: np.ndarray, starts: np.ndarray, ends: np.ndarray, *,
               sites: np.ndarray | None = None, shaped: np.ndarray | None = None) -> tuple[np.ndarray, int, int] | None:
    """The block of symbols that recurs back to back MIN_ITERATIONS times or more and is the
    whole work (see the module docstring): where each recurrence starts, and the block's
    length; None where none does. Of several, the one covering most wins, then the one
    recurring most often (a block of four iterations recurs too, a fourth as often). Also
    the index after the last recurrence. ``starts``, ``ends``: when each symbol's call ran,
    for how regularly the blocks recur. ``sites``: the calls that name where the script made
    them (Python frames, user ranges); ``shaped``: the operators with recorded shapes. A
    block of several bare operators, none on known shapes, is ambiguous (a network's layers
    recur in one pass just so) and is not taken for an iteration; one holding a call site
    (the script's own loop) or operators on the same shapes each time is, and so is one
    call recurring (a benchmark calling one op N times)."""
    n = len(symbols)
    if n < MIN_ITERATIONS:
        return None
    hashes = _Hashes(symbols)
    best: tuple[tuple[int, int, int], np.ndarray, int, int] | None = None
    positions = pd.Series(np.arange(n)).groupby(symbols).agg(list)
    for pos in positions:
        if len(pos) < MIN_ITERATIONS:
            continue
        found = _run_from(np.asarray(pos, dtype=np.int64), hashes, n)
        if found is None:
            continue
        heads, unit, stop = found
        block = slice(int(heads[0]), int(heads[0]) + unit)
        if unit > 1 and sites is not None and shaped is not None \
                and not (sites[block].any() or shaped[block].all()):
            continue
        key = (stop - int(heads[0]), len(heads), -int(heads[0]))
        if best is not None and key <= best[0]:
            continue
        if _whole_work(symbols, work, heads, stop, unit) and _regular(starts, ends, heads, stop):
            best = (key, heads, unit, stop)
    return None if best is None else (best[1], best[2], best[3])


def _run_from(pos: np.ndarray, hashes: _Hashes, n: int) -> tuple[np.ndarray, int, int] | None:
    """The run of like blocks between one symbol's occurrences: the starts of the longest
    back-to-back run of blocks of about one length, most of them with the commonest
    content; that content's length; the index after the run."""
    lengths = np.diff(pos)
    block = hashes.of(pos[:-1], pos[1:])
    values, counts = np.unique(block, return_counts=True)
    if counts.max() < MIN_ITERATIONS - 1:
        return None
    common = values[np.argmax(counts)]
    unit = int(lengths[block == common][0])
    like = (lengths >= 0.5 * unit) & (lengths <= 2 * unit)
    best = None
    i = 0
    while i < len(block):
        if not like[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(block) and like[j + 1]:
            j += 1
        count = j - i + 1
        if (block[i:j + 1] == common).sum() >= SAME_BLOCKS * count and (best is None or count > best[1] - best[0]):
            best = (i, j + 1)
        i = j + 1
    if best is None:
        return None
    heads = pos[best[0]:best[1] + 1]  # each block's start, and the start after the last
    stop = int(heads[-1])
    # The last occurrence starts one more block where the calls from it are the unit.
    if stop + unit <= n and hashes.of(np.array([stop]), np.array([stop + unit]))[0] == common:
        stop += unit
    else:
        heads = heads[:-1]
    return (heads, unit, stop) if len(heads) >= MIN_ITERATIONS else None


def _whole_work(symbols: np.ndarray, work: np.ndarray, heads: np.ndarray, stop: int, unit: int) -> bool:
    """Whether the recurring blocks are the work, not layers of one pass: they hold most of
    the level's calls or work, each holds about the work of the others (the first may run
    slower: warm-up), and the work after them is under a part of a block's. The calls after
    them that begin one more block (the profile stopped inside it) count as that block's
    where they take about its time: a pass's head that begins as a layer does (a norm, a
    linear) but holds far more work is the pass going on."""
    first = int(heads[0])
    covered = max((stop - first) / len(symbols), float(work[first:stop].sum()) / max(float(work.sum()), 1.0))
    if covered < MIN_COVER:
        return False
    sums = np.add.reduceat(work[first:stop], heads - first) if stop > first else np.zeros(0)
    typical = float(np.median(sums)) if len(sums) else 0.0
    if len(sums) > 1 and np.any(sums[1:] > BLOCK_WORK_SPREAD * typical + 1e-9):
        return False
    tail = symbols[stop:stop + unit]
    same = int(np.argmin(np.append(tail == symbols[first:first + len(tail)], False)))
    if same:
        begun = np.array([work[h:h + same].sum() for h in heads], dtype=np.float64)
        if float(work[stop:stop + same].sum()) <= BLOCK_WORK_SPREAD * float(np.median(begun)) + 1e-9:
            stop += same
    return float(work[stop:].sum()) < TAIL_SHARE * typical if typical > 0 else len(symbols) - stop < unit


def _regular(starts: np.ndarray, ends: np.ndarray, heads: np.ndarray, stop: int) -> bool:
    """Whether blocks recur at a steady pace: most of them after the first (which may be a
    warm-up) take between half and twice their median. Calls that happen to repeat, with
    long and uneven pauses between, are no loop."""
    took = np.append(np.diff(starts[heads]), ends[:stop].max() - starts[heads[-1]]).astype(np.float64)[1:]
    if not len(took):
        return True
    median = float(np.median(took))
    return median > 0 and float(((took >= 0.5 * median) & (took <= 2 * median)).mean()) >= REGULAR_SHARE


class _Hashes:
    """Polynomial hashes of a symbol sequence's slices, in wrapping 64-bit arithmetic: the
    prefix sums weigh each symbol by BASE to its position, and a slice's sum is brought
    back to its own start by BASE's inverse (BASE is odd, so it has one modulo 2**64)."""

    BASE = 1_000_003

    def __init__(self, symbols: np.ndarray) -> None:
        n = len(symbols)
        with np.errstate(over="ignore"):
            one = np.ones(1, dtype=np.uint64)
            self.power = np.cumprod(np.concatenate([one, np.full(n, self.BASE, dtype=np.uint64)]), dtype=np.uint64)
            inverse = pow(self.BASE, -1, 2 ** 64)
            self.inverse = np.cumprod(np.concatenate([one, np.full(n, inverse, dtype=np.uint64)]), dtype=np.uint64)
            weighted = (symbols.astype(np.uint64) + np.uint64(1)) * self.power[:n]
            self.prefix = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(weighted, dtype=np.uint64)])

    def of(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return (self.prefix[hi] - self.prefix[lo]) * self.inverse[lo]


def _unit_words(names: np.ndarray, limit: int = 3) -> str:
    """A recurring block in words: its first calls and how many it holds."""
    shown = ", ".join(str(n)[:60] for n in names[:limit])
    return f"{len(names)} call{'s' if len(names) != 1 else ''}: {shown}{', ...' if len(names) > limit else ''}"


# -- device signals ------------------------------------------------------------------------------


def _kernel_iterations(ev: pd.DataFrame) -> tuple[pd.DataFrame, str, str] | None:
    """Iterations from the same sequence of kernels recurring on the busiest device, where
    the host shows none: each recurrence a step, on the device's clock."""
    kernels = np.flatnonzero(one_of(ev["kind"], ("kernel",)))
    if len(kernels) < MIN_ITERATIONS:
        return None
    device = ev["device"].to_numpy()[kernels]
    values, counts = np.unique(device, return_counts=True)
    kernels = kernels[device == values[np.argmax(counts)]]
    start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    kernels = kernels[np.argsort(start[kernels], kind="stable")]
    symbols = pd.factorize(text(ev["name"].iloc[kernels]))[0].astype(np.int64)
    found = _recurring(symbols, (end[kernels] - start[kernels]).astype(np.float64), start[kernels], end[kernels])
    if found is None:
        return None
    heads, unit, stop = found
    begin = start[kernels[heads]]
    finish = np.append(begin[1:], int(end[kernels[int(heads[0]):stop]].max()))
    what = _unit_words(text(ev["name"].iloc[kernels[int(heads[0]):int(heads[0]) + unit]]))
    return (_steps(begin, finish), "kernel sequence",
            f"the same sequence of GPU kernels recurs ({what}), each recurrence a step")
