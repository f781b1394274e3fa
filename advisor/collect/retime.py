"""The job's own operators timed again at one thread, for a run recorded on a busy machine.

Where other processes hold the cores, a recorded step is no longer the mix of work the job
has on a machine of its own. Plain Python (a loader's items, autograd's bookkeeping) is
slowed by the share of time its thread waits for a core, which the collector measures. An
operator torch splits across its threads is slowed far more, and by an amount its own time
no longer tells: each parallel region ends when its slowest thread has had a core, a round
of the scheduler (tens of milliseconds at four runnable threads a core) however short the
operator. Its wall time, and even its thread's CPU time (the thread spins at the region's
end), are then the load's, not the operator's.

So each of the recorded leaf operators that hold most of the main thread's operator time
is called again after the run, with inputs of the recorded shapes and types and the
recorded scalar arguments, with torch at one thread and timed on the calling thread's CPU
clock: no parallel region, no wait for another thread, and the load's share of the time
left out of the clock. That is the operator's work as one thread does it; the step model
(advisor.step.load) reads it beside the Python time, so that a saving is a share of the
step the job has on a quiet machine.

Nothing here touches the job: fresh tensors from a generator of its own (the job's random
state is left as it was), operators that draw random numbers or act on anything but their
inputs left out, torch's thread count put back. Only names read from the trace are looked
up among torch's own operators; scalar arguments are read as literals, never run.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["RETIME_CPU_BUDGET_NS", "retime_ops"]

# What re-timing may cost the process, on its own CPU clock, and at most this many
# distinct operators (by recorded time, most first): those that hold nearly all of it.
RETIME_CPU_BUDGET_NS = 1_500_000_000
MAX_OPERATORS = 400
# Kinds of call below this share of the recorded operator time are not tried, and calls
# nested deeper than MAX_DEPTH are not looked into.
MIN_SHARE = 0.0002
MAX_DEPTH = 8
# One timing lasts at least this long on the CPU clock (a single short call is mostly the
# clock's own granularity), and the fastest of ROUNDS timings is kept.
TIMING_NS = 300_000
ROUNDS = 3
LONG_CALL_NS = 50_000_000
# A Forward call made with autograd is timed again this many frames further down the stack
# (DEEPER + 2 with the lambda and the first _nested that carry it there).
DEEPER = 20
# An operator whose inputs together take more than this is not rebuilt.
MAX_INPUT_BYTES = 256 * 2**20

# Operators that draw random numbers (they would move a generator) or whose work is not
# their inputs' (collectives, copies to devices, Python callbacks): never called.
_LEFT_OUT = re.compile(r"rand|bernoulli|dropout|normal|uniform|multinomial|exponential|geometric|cauchy|"
                       r"poisson|_local_scalar_dense|item|record_stream|set_|resize|storage|c10d|nccl|gloo|cuda|"
                       r"cudnn|miopen|mps|xpu|print|profiler|record_function|empty|lift")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DTYPES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8", "unsigned char": "uint8",
    "bool": "bool", "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
}
_ITEM_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}
# c10::ScalarType's numbering, as a dtype argument is recorded (``6``: float32).
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                 7: "float64", 9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16"}


class _Unfit(Exception):
    """An operator that cannot be rebuilt from what the trace recorded."""


def retime_ops(torch: Any, ops: pd.DataFrame, *, budget_ns: int = RETIME_CPU_BUDGET_NS,
               clock: Callable[[], int] = time.thread_time_ns) -> dict[str, Any]:
    """Re-time the operator calls ``ops`` (one thread's: id, parent_op, name, start_ns,
    end_ns, input_dims, input_types, concrete_inputs) at one thread.

    Each outermost call that can be made again is timed whole (a linear layer with the
    matrix multiply inside it); one that cannot (an autograd node, an optimizer's range)
    gives way to the calls inside it. Calls alike (name, shapes, types and scalars) are
    timed once, those that hold the most recorded time first. Returns ``{"threads": the
    job's thread count, "ops": [{"name", "input_dims", "input_types", "concrete_inputs",
    "one_thread_ns", and for calls of the Forward phase made with autograd, "no_grad_ns": the
    same call without it, and "deeper_ns": with it, "deeper_frames" further down the stack}],
    "accumulator": where such calls were timed, what making a parameter's gradient
    accumulator adds to one (``ns``, and ``deeper_ns`` further down), "covered_share": the
    share of the outermost calls' recorded time re-timed, "stack_frames": the Python frames
    above each timed call, "cost": what re-timing took, wall and CPU ns}``.

    The calls are made on a thread of their own (``clock`` is read there): its stack is the
    same few frames whoever called (a command line, a notebook's deep stack), and anomaly
    detection stores that stack with every node a timed call makes."""
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["out"] = _retime(torch, ops, budget_ns, clock)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            done["error"] = exc

    worker = threading.Thread(target=run, name="advisor-retime", daemon=True)
    worker.start()
    worker.join()
    if "error" in done:
        raise done["error"]
    return done["out"]


def _retime(torch: Any, ops: pd.DataFrame, budget_ns: int, clock: Callable[[], int]) -> dict[str, Any]:
    began_wall, began_cpu = time.perf_counter_ns(), clock()
    frame = _keyed(ops)
    top = frame[~frame["parent_op"].isin(frame["id"])]
    total = float(top["wall"].sum())
    threads = int(torch.get_num_threads())
    out: list[dict[str, Any]] = []
    covered = 0.0
    # The Python frames above each timed call (this thread's, and _Timing.round, the lambdas and
    # _graded below it): what a stack autograd's anomaly detection stores holds.
    frames = _frames_here() + 4
    # Whatever a call draws from torch's generator (a scalar may ask an operator for
    # dropout), the job's random state is put back; and its thread count.
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(1)
        try:
            generator = torch.Generator().manual_seed(0)
            forward = frame[frame["forward"]].groupby(list(_KEYS), sort=False).size()
            spent = lambda: clock() - began_cpu > budget_ns
            # Half the budget for choosing, making ready and warming the calls; the rest
            # for the rounds that time them.
            chosen = lambda: clock() - began_cpu > budget_ns // 2
            cut = _cut(frame, top, lambda key: _try(torch, generator, key, key in forward.index), total, chosen)
            timed: list[tuple[tuple[str, ...], float, dict[str, _Timing]]] = []
            for key, (wall, call, reset, plain) in cut.items():
                if len(timed) >= MAX_OPERATORS or chosen():
                    break
                try:
                    timings = {"one_thread_ns": _Timing.ready(call, reset, clock)}
                    if plain is not None:
                        timings["no_grad_ns"] = _Timing.ready(plain, reset, clock)
                        # From DEEPER frames further down: what each frame of the stack adds
                        # (anomaly detection stores the whole stack at every node).
                        timings["deeper_ns"] = _Timing.ready(lambda call=call: _nested(DEEPER, call), reset, clock)
                except Exception:  # noqa: BLE001 - a call that fails when made again is left out, not fatal
                    continue
                timed.append((key, wall, timings))
            # Round by round across all the calls, not each call's rounds at once: a spell in
            # which the machine runs slow (another process, the clock's frequency) then
            # slows one round of many calls, and each keeps its fastest.
            failed: set[tuple[str, ...]] = set()
            for _ in range(ROUNDS):
                for key, _wall, timings in timed:
                    if key in failed or spent():
                        continue
                    try:
                        for timing in timings.values():
                            timing.round(clock)
                    except Exception:  # noqa: BLE001 - as above
                        failed.add(key)
            for key, wall, timings in timed:
                if key not in failed:
                    out.append({**dict(zip(_KEYS, key, strict=True)),
                                **{name: timing.best for name, timing in timings.items()}})
                    covered += wall
            accumulator = _accumulator(torch, clock) if any("no_grad_ns" in row for row in out) else None
        finally:
            torch.set_num_threads(threads)
    return {"threads": threads, "ops": out, **({"accumulator": accumulator} if accumulator else {}),
            "covered_share": round(min(covered / total, 1.0), 4) if total else 0.0,
            "stack_frames": frames, "deeper_frames": DEEPER + 2,
            "cost": {"wall_ns": time.perf_counter_ns() - began_wall, "cpu_ns": clock() - began_cpu}}


def _accumulator(torch: Any, clock: Callable[[], int]) -> dict[str, float]:
    """What a parameter's gradient accumulator adds to the forward call that makes it, ns,
    at this stack and DEEPER frames further down: the same call on a leaf that requires
    grad, whose accumulator nothing else holds, and on a tensor made from one. A job makes
    its parameters' accumulators afresh each step (backward lets them go), each a node, and
    with anomaly detection a stored stack, while the timed calls' inputs make none."""
    leaf, made = torch.ones(1).requires_grad_(), torch.ones(1).requires_grad_().clone()
    timings = [_Timing.ready(call, None, clock) for call in (
        lambda: _graded(torch, True, lambda: torch.neg(leaf)), lambda: _graded(torch, True, lambda: torch.neg(made)),
        lambda: _nested(DEEPER, lambda: _graded(torch, True, lambda: torch.neg(leaf))),
        lambda: _nested(DEEPER, lambda: _graded(torch, True, lambda: torch.neg(made))))]
    for _ in range(ROUNDS):
        for timing in timings:
            timing.round(clock)
    on_leaf, on_made, deeper_leaf, deeper_made = (timing.best for timing in timings)
    return {"ns": max(on_leaf - on_made, 0.0), "deeper_ns": max(deeper_leaf - deeper_made, 0.0)}


def _nested(depth: int, call: Callable[[], Any]) -> Any:
    """``call()`` made ``depth`` Python frames further down the stack."""
    return call() if depth <= 0 else _nested(depth - 1, call)


def _frames_here() -> int:
    frame, count = sys._getframe(1), 0
    while frame is not None:
        count, frame = count + 1, frame.f_back
    return count


_KEYS = ("name", "input_dims", "input_types", "concrete_inputs")


def _keyed(ops: pd.DataFrame) -> pd.DataFrame:
    frame = pd.DataFrame({"id": ops["id"].to_numpy(), "parent_op": ops["parent_op"].to_numpy(),
                          "wall": np.maximum(ops["end_ns"].to_numpy() - ops["start_ns"].to_numpy(), 0)})
    for key in _KEYS:
        frame[key] = ops[key].astype(str).to_numpy() if key in ops else ""
    # Made with autograd: the Forward phase's calls, with a sequence number where the trace
    # records them (a forward under no_grad records none).
    forward = (ops["phase"].astype(str).to_numpy() == "Forward") if "phase" in ops else np.zeros(len(ops), bool)
    sequence = ops["sequence"].to_numpy() if "sequence" in ops else np.full(len(ops), -1)
    frame["forward"] = forward & ((sequence >= 0) | ~(sequence >= 0).any())
    return frame


def _try(torch: Any, generator: Any, key: tuple[str, ...], forward: bool) -> tuple[Any, ...] | None:
    """The call made ready again, what puts its inputs back, and for a call of the Forward
    phase, the same call without autograd (else None). A call of the Forward phase is made
    with its floating inputs requiring grad, as a model's activations do, so that its time
    holds the autograd node it records (and whatever the job's autograd settings add to
    that, anomaly detection's stack capture), where that works."""
    for grad in ((True, False) if forward else (False,)):
        try:
            call, reset = _rebuilt(torch, generator, *key, grad=grad)
            _graded(torch, grad, call)
        except Exception:  # noqa: BLE001 - not every recorded call can be made again
            continue
        plain = (lambda call=call: _graded(torch, False, call)) if grad else None
        return (lambda call=call, grad=grad: _graded(torch, grad, call)), reset, plain
    return None


def _graded(torch: Any, grad: bool, call: Callable[[], Any]) -> Any:
    with torch.set_grad_enabled(grad):
        return call()


def _cut(frame: pd.DataFrame, top: pd.DataFrame, rebuild: Callable[[tuple[str, ...]], Any],
         total: float, spent: Callable[[], bool]) -> dict[tuple[str, ...], tuple[Any, ...]]:
    """The calls to time: level by level from the outermost, kinds of call that can be
    made again, by recorded time, most first; the calls inside the others come next. A
    kind below MIN_SHARE of the time is not tried (building its inputs costs more than it
    would tell), nor any once the budget is ``spent()``."""
    found: dict[tuple[str, ...], tuple[Any, ...]] = {}
    tried: dict[tuple[str, ...], Any] = {}
    level = top
    for _ in range(MAX_DEPTH):
        if not len(level):
            break
        walls = level.groupby(list(_KEYS), sort=False)["wall"].sum().sort_values(ascending=False)
        made_again: set[tuple[str, ...]] = set()
        for key, wall in walls.items():
            if (total and wall < MIN_SHARE * total) or spent():
                break
            if key not in tried:
                tried[key] = rebuild(key)
            if tried[key] is not None:
                made_again.add(key)
                held = found.get(key)
                found[key] = ((held[0] if held else 0.0) + float(wall), *tried[key])
        keys = pd.MultiIndex.from_frame(level[list(_KEYS)])
        rest = level[~keys.isin(list(made_again))] if made_again else level
        level = frame[frame["parent_op"].isin(rest["id"])]
    return dict(sorted(found.items(), key=lambda item: -item[1][0]))


@dataclass
class _Timing:
    """One call's timing on the CPU clock, ns: its fastest of ROUNDS rounds of ``calls``
    calls each (enough that a round lasts TIMING_NS: a single short call is mostly the
    clock's own granularity). An operator that changes its inputs gets them back before
    each round, and fewer calls in one: a scale below one applied a thousand times would
    leave denormal numbers, which the CPU handles many times slower than the job's own."""

    call: Callable[[], Any]
    reset: Callable[[], Any] | None
    calls: int
    best: float

    @classmethod
    def ready(cls, call: Callable[[], Any], reset: Callable[[], Any] | None, clock: Callable[[], int]) -> _Timing:
        """The call made once (it warms caches and allocations up, and sizes the rounds);
        that first time stands where no round follows."""
        began = clock()
        call()
        once = max(clock() - began, 1)
        # A long call is its own timing: a warm-up is little of it.
        calls = 0 if once >= LONG_CALL_NS else max(1, min(1000 if reset is None else 50, math.ceil(TIMING_NS / once)))
        return cls(call, reset, calls, float(once))

    def round(self, clock: Callable[[], int]) -> None:
        if not self.calls:
            return
        if self.reset is not None:
            self.reset()
        began = clock()
        for _ in range(self.calls):
            self.call()
        self.best = min(self.best, (clock() - began) / self.calls)


def _rebuilt(torch: Any, generator: Any, name: str, dims: str, types: str,
             concrete: str, *, grad: bool = False) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """The recorded call, ready to make again with fresh inputs, and where it writes to its
    inputs, what puts them back."""
    namespace, _, short = name.partition("::")
    if namespace != "aten" or not short or _LEFT_OUT.search(short):
        raise _Unfit(name)
    shapes, kinds = _json_list(dims), _json_list(types)
    values = _json_list(concrete) if concrete else [""] * len(kinds)
    if len(shapes) != len(kinds):
        raise _Unfit(name)
    values = (values + [""] * len(kinds))[: len(kinds)]
    # A name read from the trace is only looked up among torch's own operators.
    packet = getattr(torch.ops.aten, short, None) if _NAME.fullmatch(short) else None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        raise _Unfit(name)
    for overload in packet.overloads():
        op = getattr(packet, overload)
        schema = op._schema
        if any(a.alias_info is not None and a.alias_info.is_write and a.kwarg_only for a in schema.arguments):
            continue  # an out= overload
        if len(schema.arguments) != len(kinds):
            continue
        try:
            args, kwargs = _arguments(torch, generator, schema.arguments, shapes, kinds, values, grad)
        except _Unfit:
            continue
        written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
        inputs = [*args, *kwargs.values()]
        # An optimizer's _foreach_ call writes to each tensor of a list.
        targets = [t for i in written for t in _tensors(inputs[i], torch)]
        pairs = [(t, t.detach().clone()) for t in targets]
        reset = (lambda pairs=pairs: _put_back(torch, pairs)) if pairs else None
        return (lambda op=op, args=args, kwargs=kwargs: op(*args, **kwargs)), reset
    raise _Unfit(name)


def _arguments(torch: Any, generator: Any, schema_args: list[Any], shapes: list[Any], kinds: list[Any],
               values: list[Any], grad: bool) -> tuple[list[Any], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    # The inputs' size from their recorded shapes, before any is made: a view's recorded
    # shape (an expand) can be far larger than the memory the job held.
    if _planned_bytes(shapes, kinds) > MAX_INPUT_BYTES:
        raise _Unfit("inputs too large")
    for arg, shape, kind, value in zip(schema_args, shapes, kinds, values, strict=True):
        typ = str(getattr(arg, "real_type", arg.type))
        if kind in ("", None) and value in ("", None) and "Tensor" not in typ and arg.has_default_value():
            built = arg.default_value  # not recorded (a string, a device): the schema's default
        else:
            built = _argument(torch, generator, typ, shape, kind, value, grad)
        if arg.kwarg_only:
            kwargs[arg.name] = built
        else:
            args.append(built)
    return args, kwargs


def _put_back(torch: Any, pairs: list[tuple[Any, Any]]) -> None:
    with torch.no_grad():
        for target, source in pairs:
            target.copy_(source)


def _planned_bytes(shapes: list[Any], kinds: list[Any]) -> int:
    """The bytes the tensors of a call's inputs take, from the shapes and types recorded
    (a list's tensors at four bytes an element)."""
    total = 0
    for shape, kind in zip(shapes, kinds, strict=False):
        lists = shape if kind == "TensorList" and isinstance(shape, list) else [shape] if kind in _DTYPES else []
        size = 4 if kind == "TensorList" else _ITEM_BYTES.get(_DTYPES.get(str(kind), ""), 8)
        for one in lists:
            if isinstance(one, list) and all(isinstance(d, int) and d >= 0 for d in one):
                total += math.prod(one) * size
    return total


def _tensors(value: Any, torch: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _argument(torch: Any, generator: Any, typ: str, shape: Any, kind: Any, value: Any, grad: bool = False) -> Any:
    """One argument of schema type ``typ`` (its real type as torch spells it: ``Tensor``,
    ``Optional[ScalarType]``, ``List[int]``) from what the trace recorded of it."""
    optional = typ.startswith("Optional[")
    base = typ[len("Optional["):-1] if optional else typ
    if base == "Tensor":
        if kind in ("", None):
            return None if optional else _unfit(typ)
        return _tensor(torch, generator, shape, kind, grad)
    if base in ("List[Tensor]", "List[Optional[Tensor]]"):
        if kind != "TensorList":
            raise _Unfit(typ)
        # The list's element types are not recorded: its tensors take the default float type.
        return [_tensor(torch, generator, s, "float", grad) for s in (shape or [])]
    if kind in ("", None) or value in ("", None):
        if optional or base in ("Layout", "Device", "MemoryFormat"):
            return None
        raise _Unfit(typ)
    literal = _literal(value)
    if base == "ScalarType":
        dtype = _SCALAR_TYPES.get(literal) if isinstance(literal, int) else None
        return getattr(torch, dtype) if dtype is not None else _unfit(typ)
    if base in ("Layout", "Device", "MemoryFormat", "Generator"):
        return None if optional else _unfit(typ)
    if base == "bool":
        return bool(literal)
    if base in ("int", "SymInt"):
        return int(literal)
    if base == "float":
        return float(literal)
    if base == "number":
        return literal if isinstance(literal, (int, float, bool)) else _unfit(typ)
    item = {"List[int]": int, "List[SymInt]": int, "List[float]": float, "List[bool]": bool}.get(base)
    if item is not None:
        return [item(v) for v in (literal if isinstance(literal, (list, tuple)) else [literal])]
    raise _Unfit(typ)


def _unfit(why: str) -> Any:
    raise _Unfit(why)


def _tensor(torch: Any, generator: Any, shape: Any, kind: Any, grad: bool = False) -> Any:
    dtype_name = _DTYPES.get(str(kind))
    if dtype_name is None or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _Unfit(str(kind))
    dtype = getattr(torch, dtype_name)
    if dtype.is_floating_point or dtype.is_complex:
        made = torch.rand(shape, generator=generator, dtype=dtype)
        # Not a leaf: a call on a leaf that requires grad makes the leaf's gradient
        # accumulator (a node, and with anomaly detection a stack) each time its output is
        # freed. A job's activations make none; its parameters' are counted apart
        # (_accumulator), once a step each.
        return made.requires_grad_().clone() if grad else made
    # Integers and masks as zeros: an index of zero is in range wherever an index is.
    return torch.zeros(shape, dtype=dtype)


def _json_list(text: str) -> list[Any]:
    try:
        value = json.loads(text) if text else []
    except ValueError as exc:
        raise _Unfit(text) from exc
    if not isinstance(value, list):
        raise _Unfit(text)
    return value


def _literal(value: Any) -> Any:
    """A recorded scalar (``"1"``, ``"0."``, ``"False"``, ``"[64, 1024]"``) as a Python value:
    a literal only, never code."""
    if not isinstance(value, str):
        return value
    try:
        return ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        if value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise _Unfit(value) from None
