"""The pieces every cost model shares: OpCost, the profiler's argument spelling, dtypes.

The PyTorch profiler records each argument of an op three (or four) ways, in parallel
lists: "Input Dims" (a tensor's sizes, a list of sizes for a TensorList, [] for anything
else), "Input type" (the tensor's dtype as caffe2 spells it - "float", "c10::Half",
"long int" - or a word for a non-tensor: "Scalar", "ScalarList", "TensorList", "" for None,
strings and devices; traces of 2021 say "Int", "Bool", "Double", "GenericList"),
"Input Strides" (newer traces) and "Concrete Inputs" (newer traces: the value of each
scalar or list argument as text, "" for tensors). ``Args`` wraps those lists so a model
asks for "the tensor at position 1" or "the value of argument 3 if it was recorded".
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from typing import Any

NAN = float("nan")

KINDS = ("gemm", "conv", "attention", "elementwise", "reduction", "norm", "embedding", "copy", "view", "other")

# Profiler dtype spelling -> (short name, bytes per element). Checked against the "Input
# type" torch 2.13's CPU profiler writes for every dtype torch has (caffe2 TypeMeta names).
DTYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4),
    "double": ("fp64", 8),
    "c10::Half": ("fp16", 2),
    "c10::BFloat16": ("bf16", 2),
    "c10::Float8_e4m3fn": ("fp8", 1),
    "c10::Float8_e5m2": ("fp8", 1),
    "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1),
    "c10::Float8_e8m0fnu": ("fp8", 1),
    # two fp4 values packed per element: the element is the byte
    "c10::Float4_e2m1fn_x2": ("fp4", 1),
    "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1),
    "short int": ("int16", 2),
    "int": ("int32", 4),
    "long int": ("int64", 8),
    "short unsigned int": ("uint16", 2),
    "unsigned int": ("uint32", 4),
    "long unsigned int": ("uint64", 8),
    "bool": ("bool", 1),
    "c10::complex<c10::Half>": ("complex32", 4),
    "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16),
    "c10::qint8": ("int8", 1),
    "c10::quint8": ("uint8", 1),
    "c10::qint32": ("int32", 4),
    "c10::quint4x2": ("uint8", 1),
    "c10::bits8": ("uint8", 1),
}

# ScalarType codes as "Concrete Inputs" writes a dtype argument (c10/core/ScalarType.h).
SCALAR_TYPES: dict[int, str] = {
    0: "unsigned char", 1: "signed char", 2: "short int", 3: "int", 4: "long int", 5: "c10::Half",
    6: "float", 7: "double", 8: "c10::complex<c10::Half>", 9: "c10::complex<float>",
    10: "c10::complex<double>", 11: "bool", 12: "c10::qint8", 13: "c10::quint8", 14: "c10::qint32",
    15: "c10::BFloat16", 16: "c10::quint4x2", 23: "c10::Float8_e5m2", 24: "c10::Float8_e4m3fn",
    25: "c10::Float8_e5m2fnuz", 26: "c10::Float8_e4m3fnuz", 27: "short unsigned int",
    28: "unsigned int", 29: "long unsigned int", 44: "c10::Float8_e8m0fnu", 45: "c10::Float4_e2m1fn_x2",
}

_CATEGORY = {
    "bool": 0,
    "uint8": 1, "int8": 1, "int16": 1, "int32": 1, "int64": 1, "uint16": 1, "uint32": 1, "uint64": 1,
    "fp8": 2, "fp4": 2, "fp16": 2, "bf16": 2, "fp32": 2, "fp64": 2,
    "complex32": 3, "complex64": 3, "complex128": 3,
}
# Within a category the wider type wins; the two pairs that widen to a third are special.
_RANK = {
    "bool": 0, "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 3, "uint32": 3, "int64": 4, "uint64": 4,
    "fp4": 0, "fp8": 1, "fp16": 2, "bf16": 2, "fp32": 3, "fp64": 4,
    "complex32": 1, "complex64": 2, "complex128": 3,
}
_SIZE = {short: size for short, size in DTYPES.values()}
_DEFAULT_OF_CATEGORY = {0: "bool", 1: "int64", 2: "fp32", 3: "complex64"}
# Old (2021) traces name scalar arguments by their C++ type, which says the category.
_SCALAR_CATEGORY = {"Bool": 0, "Int": 1, "Double": 2}

# Argument types that are a list of values, not tensors.
LIST_TYPES_SPELLING = ("ScalarList", "GenericList", "IntList")

MISSING = object()  # an argument whose value the trace does not record


class Uncostable(Exception):
    """The recorded arguments do not fit the op's model (wrong rank, mismatched sizes)."""


def uncostable(why: str) -> Uncostable:
    """The exception a model raises (``raise uncostable(...)``) for arguments it cannot cost."""
    return Uncostable(why)


@dataclass(frozen=True, slots=True)
class OpCost:
    """What one op call computes and moves, from its recorded arguments.

    ``flops``: floating-point (or integer) operations, a multiply-add counted as 2 as
    torch.utils.flop_counter does. ``bytes_read`` / ``bytes_written``: the ideal traffic,
    each distinct input element read once and each output element written once (what a
    roofline's memory bound assumes). NaN in any of the three means the trace does not
    record enough to know it (``model`` says what is missing); it is never guessed.

    ``dtype``: the compute dtype (fp32, fp16, bf16, fp8, int8...; "tf32-eligible" for fp32
    GEMMs, convolutions and attention, which run on TF32 tensor cores where PyTorch allows
    it and on FP32 cores otherwise: the trace does not say which).

    GEMM dimensions (gemm and attention): ``m``, ``n``, ``k`` and ``batch`` (the number of
    independent m x n x k products). Convolution: ``batch`` (N), ``c_in``, ``c_out``,
    ``kernel`` and ``out_spatial`` (sizes per spatial dimension) and ``groups``.
    """

    flops: float
    bytes_read: float
    bytes_written: float
    dtype: str
    kind: str
    model: str
    m: int | None = None
    n: int | None = None
    k: int | None = None
    batch: int | None = None
    c_in: int | None = None
    c_out: int | None = None
    kernel: tuple[int, ...] | None = None
    out_spatial: tuple[int, ...] | None = None
    groups: int | None = None

    @property
    def bytes(self) -> float:
        """Bytes read plus bytes written."""
        return self.bytes_read + self.bytes_written

    @property
    def complete(self) -> bool:
        """Whether flops and both byte counts are known."""
        return not (math.isnan(self.flops) or math.isnan(self.bytes_read) or math.isnan(self.bytes_written))


def prod(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


@dataclass(frozen=True, slots=True)
class Arg:
    """One recorded argument."""

    type: str  # as recorded: a dtype spelling, "Scalar", "TensorList", ""...
    dims: tuple  # a tensor's sizes; for a TensorList, one tuple of sizes per tensor
    strides: tuple | None  # same shape as dims where recorded
    value: Any  # the concrete value, or MISSING

    @property
    def is_tensor(self) -> bool:
        return self.type in DTYPES

    @property
    def is_tensor_list(self) -> bool:
        return self.type == "TensorList" and all(isinstance(d, tuple) for d in self.dims)

    @property
    def short(self) -> str:
        return DTYPES[self.type][0]

    @property
    def itemsize(self) -> int:
        return DTYPES[self.type][1]

    @property
    def numel(self) -> int:
        return prod(self.dims)

    @property
    def distinct(self) -> int:
        """Elements in memory behind the tensor: a broadcast (stride 0) dimension holds
        one element whatever its size."""
        return distinct_elements(self.dims, self.strides)

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct elements (what reading the tensor moves)."""
        return self.distinct * self.itemsize


def distinct_elements(dims, strides) -> int:
    if any(d == 0 for d in dims):
        return 0
    if strides is None or len(strides) != len(dims):
        return prod(dims)
    return prod(d for d, s in zip(dims, strides) if s != 0)


def _as_list(value) -> list | None:
    """A recorded column value (JSON text or an already parsed list) as a list."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        if not value:
            return None
        try:
            parsed = json.loads(value)
        except ValueError:
            try:
                parsed = ast.literal_eval(value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
        return list(parsed) if isinstance(parsed, (list, tuple)) else None
    return None


def _int_tuple(value) -> tuple | None:
    if isinstance(value, (list, tuple)) and all(type(v) is int for v in value):
        return tuple(value)
    return None


def _parse_concrete(text: Any) -> Any:
    """One "Concrete Inputs" entry: '[2, 2]', '1', '0.', 'True', '' (not recorded)."""
    if not isinstance(text, str):
        return MISSING if text is None else text
    if text == "":
        return MISSING
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text  # a string argument, recorded bare


class Args:
    """The recorded arguments of one op call, by position."""

    def __init__(self, dims, types, strides=None, concrete=None):
        dims_list = _as_list(dims)
        types_list = _as_list(types)
        if dims_list is None or types_list is None:
            raise uncostable("no input shapes recorded")
        strides_list = _as_list(strides) or []
        concrete_list = _as_list(concrete) or []
        n = max(len(dims_list), len(types_list))
        args = []
        for i in range(n):
            type_ = types_list[i] if i < len(types_list) and isinstance(types_list[i], str) else ""
            raw_dims = dims_list[i] if i < len(dims_list) else []
            raw_strides = strides_list[i] if i < len(strides_list) else None
            value = _parse_concrete(concrete_list[i]) if i < len(concrete_list) else MISSING
            if type_ == "TensorList":
                parts = raw_dims if isinstance(raw_dims, list) else []
                sizes = tuple(_int_tuple(p) for p in parts)
                if any(s is None for s in sizes):
                    sizes = ()
                stride_parts = raw_strides if isinstance(raw_strides, list) and len(raw_strides) == len(sizes) else None
                strides_t = tuple(_int_tuple(p) for p in stride_parts) if stride_parts else None
                args.append(Arg(type_, sizes, strides_t, value))
                continue
            sizes = _int_tuple(raw_dims)
            if type_ in DTYPES and sizes is None:
                type_ = ""  # a dtype with no usable sizes is not a tensor we can cost
            args.append(Arg(type_, sizes or (), _int_tuple(raw_strides), value))
        self.args = args

    def __len__(self) -> int:
        return len(self.args)

    def __getitem__(self, i: int) -> Arg:
        return self.args[i]

    def tensor(self, i: int) -> Arg:
        """The tensor at position ``i``; Uncostable if there is none."""
        if i >= len(self.args) or not self.args[i].is_tensor:
            raise uncostable(f"argument {i} is not a recorded tensor")
        return self.args[i]

    def opt_tensor(self, i: int) -> Arg | None:
        if i < len(self.args) and self.args[i].is_tensor:
            return self.args[i]
        return None

    def type(self, i: int) -> str:
        return self.args[i].type if i < len(self.args) else ""

    def value(self, i: int) -> Any:
        """The recorded value of a non-tensor argument; MISSING where the trace does
        not record it (older traces, or a number without Concrete Inputs).

        None where the argument is typed "" with no value: the profiler's spelling of
        None, but also of a string or a device argument. A caller asking about an
        optional number or list may read it as None; one asking about a string (gelu's
        approximate, conv2d's padding="same") must read it as unknown.
        """
        if i >= len(self.args):
            return MISSING
        arg = self.args[i]
        if arg.value is not MISSING:
            return arg.value
        if arg.type == "" and not arg.dims:
            return None
        return MISSING

    def tensors(self, stop: int | None = None) -> list[Arg]:
        return [a for a in self.args[:stop] if a.is_tensor]


def dtype_from_code(value: Any) -> str | None:
    """The profiler dtype spelling for a ScalarType code from "Concrete Inputs"."""
    if type(value) is int:
        return SCALAR_TYPES.get(value)
    return None


def itemsize_of(short: str) -> int:
    return _SIZE[short]


def promote(shorts: list[str]) -> str:
    """The result dtype of combining tensors of these dtypes (torch's promotion lattice)."""
    result = shorts[0]
    for other in shorts[1:]:
        result = _promote_pair(result, other)
    return result


def _promote_pair(a: str, b: str) -> str:
    if a == b:
        return a
    ca, cb = _CATEGORY[a], _CATEGORY[b]
    if ca != cb:
        winner, loser = (a, b) if ca > cb else (b, a)
        if _CATEGORY[winner] == 3 and loser == "fp64":
            return "complex128"
        return winner
    if {a, b} == {"fp16", "bf16"}:
        return "fp32"
    if {a, b} == {"uint8", "int8"}:
        return "int16"
    if {a, b} == {"complex32", "complex64"} or {a, b} == {"complex32", "complex128"}:
        return a if a != "complex32" else b
    return a if _RANK[a] >= _RANK[b] else b


def result_dtype(args: list[Arg]) -> str:
    """Result dtype of an elementwise op over these arguments: dimensioned tensors first,
    then zero-dim tensors, then scalars whose category the trace records (old traces)."""
    dimensioned = [a.short for a in args if a.is_tensor and a.dims]
    zero_dim = [a.short for a in args if a.is_tensor and not a.dims]
    result = promote(dimensioned) if dimensioned else promote(zero_dim) if zero_dim else None
    if result is None:
        raise uncostable("no tensor operand")
    if zero_dim and dimensioned:
        zd = promote(zero_dim)
        if _CATEGORY[zd] > _CATEGORY[result]:
            result = zd
    for a in args:
        category = _SCALAR_CATEGORY.get(a.type)
        if category is not None and category > _CATEGORY[result]:
            result = _DEFAULT_OF_CATEGORY[category]
    return result


def category(short: str) -> int:
    return _CATEGORY[short]


def broadcast(shapes: list[tuple]) -> tuple:
    """NumPy/PyTorch broadcasting of several shapes; Uncostable if they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, start=ndim - len(shape)):
            if size == out[i] or size == 1:
                continue
            if out[i] == 1:
                out[i] = size
            else:
                raise uncostable(f"shapes {shapes} do not broadcast")
    return tuple(out)


def compute_dtype(short: str, kind: str) -> str:
    """The dtype a roofline should look a peak up by: fp32 matrix work may run on TF32
    tensor cores, which the trace does not record, so it is named as eligible."""
    if short == "fp32" and kind in ("gemm", "conv", "attention"):
        return "tf32-eligible"
    return short


def fmt_shape(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"
