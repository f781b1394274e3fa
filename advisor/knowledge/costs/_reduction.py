"""Reductions (sum, mean, amax, max, argmax, all, norm, var, logsumexp...), scans
(cumsum...) and softmax / log_softmax with their backward ops.

FLOPs per input element: 1 for a sum, product, comparison (max) or logical reduction, 2
for a norm (square, add), 4 for var/std (mean, subtract, square, add), 4 for logsumexp
(max, subtract, exp, add), 5 for softmax and log_softmax (max, subtract, exp, sum, scale),
4 for their backward. Bytes: the input read once and the output written once. The output
size needs the reduced dims, which only Concrete Inputs record; where they are missing
the bytes written are NaN.
"""

from __future__ import annotations

import math

from advisor.knowledge.costs import _elementwise
from advisor.knowledge.costs._model import (
    DTYPES,
    LIST_TYPES_SPELLING,
    MISSING,
    NAN,
    Args,
    OpCost,
    category,
    dtype_from_code,
    fmt_shape,
    itemsize_of,
    uncostable,
)

# name -> (dim position, FLOPs per input element, output rule)
_REDUCTIONS = {
    "sum": (1, 1, "sum"), "nansum": (1, 1, "sum"), "prod": (1, 1, "sum"), "mean": (1, 1, "same"),
    "amax": (1, 1, "same"), "amin": (1, 1, "same"), "max": (1, 1, "values+indices"),
    "min": (1, 1, "values+indices"), "argmax": (1, 1, "index"), "argmin": (1, 1, "index"),
    "all": (1, 1, "bool"), "any": (1, 1, "bool"), "logsumexp": (1, 4, "float"),
    "norm": (2, 2, "float"), "linalg_vector_norm": (2, 2, "float"), "var": (1, 4, "float"),
    "std": (1, 4, "float"), "var_mean": (1, 4, "float x2"), "std_mean": (1, 4, "float x2"),
    "count_nonzero": (1, 2, "index"),
}
# Where the dtype= argument sits, for the reductions that take one, by argument count of
# the overload without it (sum(self, dtype) vs sum(self, dim, keepdim, dtype)).
_DTYPE_AT = {"sum": {2: 1, 4: 3}, "nansum": {4: 3}, "prod": {2: 1, 4: 3}, "mean": {2: 1, 4: 3}}


def _reduced_dims(base: str, args: Args):
    """The dims reduced: a tuple, "all", or MISSING where the trace does not say."""
    x = args.tensor(0)
    pos = _REDUCTIONS[base][0]
    if len(args) <= pos:
        return "all"
    arg_type = args.type(pos)
    if base in ("norm",) and len(args) == 2:
        return "all"  # norm(self, p)
    if base in ("var", "std", "var_mean", "std_mean") and len(args) == 2 and arg_type not in LIST_TYPES_SPELLING:
        return "all"  # var(self, unbiased)
    if base in ("sum", "mean", "prod", "nansum") and len(args) == 2:
        return "all"  # sum(self, dtype)
    value = args.value(pos)
    if value is None:
        return "all"
    if value is MISSING:
        return MISSING
    if type(value) is int:
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(type(v) is int for v in value):
        raise uncostable(f"dim {value!r}")
    if not value:
        return "all"
    ndim = max(len(x.dims), 1)
    dims = set()
    for d in value:
        if not -ndim <= d < ndim:
            raise uncostable(f"dim {d} out of range")
        dims.add(d % ndim)
    return tuple(sorted(dims))


def _out_itemsize(base: str, args: Args, rule: str, in_short: str) -> float:
    if rule in ("sum", "same"):
        dtype_at = _DTYPE_AT.get(base, {}).get(len(args))
        if dtype_at is not None:
            code = args.value(dtype_at)
            if code is MISSING:
                return NAN
            if code is not None:
                spelled = dtype_from_code(code)
                if spelled is None:
                    raise uncostable(f"dtype code {code!r}")
                return float(DTYPES[spelled][1])
        if rule == "sum" and category(in_short) < 2:
            return 8.0  # integer and bool sums accumulate into int64
        return float(itemsize_of(in_short))
    if rule == "values+indices":
        return float(itemsize_of(in_short) + 8)
    if rule == "index":
        return 8.0
    if rule == "bool":
        return 1.0
    size = itemsize_of(in_short) if category(in_short) >= 2 else 4
    if in_short.startswith("complex"):
        size //= 2  # the norm of a complex tensor is real
    return float(size * (2 if rule == "float x2" else 1))


def reduction(name: str, args: Args) -> OpCost:
    base = name.removeprefix("aten::")
    if base in ("max", "min") and len(args) >= 2 and args[1].is_tensor:
        return _elementwise.pointwise("aten::maximum" if base == "max" else "aten::minimum", args)
    x = args.tensor(0)
    _pos, per_element, rule = _REDUCTIONS[base]
    reduced = _reduced_dims(base, args)
    elements = x.numel
    if reduced == "all":
        out_elements = 1
        over = "all dims"
    elif reduced is MISSING:
        out_elements = None
        over = "dims not recorded"
    else:
        size = 1
        for d in reduced:
            size *= x.dims[d] if x.dims else 1
        out_elements = elements // size if size else 0
        over = f"dims {list(reduced)}"
    itemsize = _out_itemsize(base, args, rule, x.short)
    written = NAN if out_elements is None else out_elements * itemsize
    model = f"{per_element} per input element x {elements} ({fmt_shape(x.dims)}), reduced over {over}"
    if out_elements is None:
        model += "; the output size is unknown, so the bytes written are NaN"
    elif math.isnan(written):
        model += "; dtype= not recorded, so the bytes written are NaN"
    return OpCost(flops=float(per_element * elements), bytes_read=float(x.nbytes), bytes_written=float(written),
                  dtype=x.short, kind="reduction", model=model)


_SCANS = {"cumsum": 1, "cumprod": 1, "cummax": 1, "cummin": 1, "logcumsumexp": 3}


def scan(name: str, args: Args) -> OpCost:
    """cumsum(self, dim, dtype) and friends: one output element per input element."""
    base = name.removeprefix("aten::").rstrip("_")
    x = args.tensor(0)
    per_element = _SCANS[base]
    itemsize = float(x.itemsize)
    if base in ("cumsum", "cumprod"):
        code = args.value(2)
        if code is MISSING:
            itemsize = NAN
        elif code is not None:
            spelled = dtype_from_code(code)
            itemsize = float(DTYPES[spelled][1]) if spelled else NAN
        elif category(x.short) < 2:
            itemsize = 8.0
    elif base in ("cummax", "cummin"):
        itemsize += 8  # values and indices
    return OpCost(flops=float(per_element * x.numel), bytes_read=float(x.nbytes), bytes_written=x.numel * itemsize,
                  dtype=x.short, kind="reduction",
                  model=f"scan: {per_element} per element x {x.numel} ({fmt_shape(x.dims)})")


def softmax(name: str, args: Args) -> OpCost:
    """softmax/log_softmax(self, dim, dtype) and _softmax/_log_softmax(self, dim,
    half_to_float): 5 per element; the output dtype is the input's unless dtype= or
    half_to_float says otherwise."""
    x = args.tensor(0)
    flag = args.value(2)
    if name in ("aten::_softmax", "aten::_log_softmax"):
        if flag is True:
            out_size = 4.0
        elif flag is False or x.short in ("fp32", "fp64"):
            out_size = float(x.itemsize)
        else:
            out_size = NAN  # half_to_float not recorded
    else:
        if flag is None:
            out_size = float(x.itemsize)
        elif dtype_from_code(flag) is not None:
            out_size = float(DTYPES[dtype_from_code(flag)][1])
        else:
            out_size = NAN  # a dtype= was given but not recorded
    model = f"5 per element x {x.numel} ({fmt_shape(x.dims)}): max, subtract, exp, sum, scale"
    if math.isnan(out_size):
        model += "; the output dtype is not recorded, so the bytes written are NaN"
    return OpCost(flops=float(5 * x.numel), bytes_read=float(x.nbytes), bytes_written=x.numel * out_size,
                  dtype=x.short, kind="reduction", model=model)


def softmax_backward(name: str, args: Args) -> OpCost:
    """_softmax_backward_data / _log_softmax_backward_data(grad_output, output, dim,
    input_dtype): 4 per element; the grad input has the forward input's dtype (a tensor in
    2021 traces, a dtype code in newer ones)."""
    grad, out = args.tensor(0), args.tensor(1)
    if grad.dims != out.dims:
        raise uncostable("grad_output and output differ in shape")
    last = args[3] if len(args) > 3 else None
    if last is not None and last.is_tensor:
        out_size = float(last.itemsize)
    else:
        code = args.value(3)
        spelled = dtype_from_code(code)
        if spelled is not None:
            out_size = float(DTYPES[spelled][1])
        elif grad.short not in ("fp32", "fp64"):
            # a half gradient means a half forward output, so no half_to_float: the input
            # had the gradient's dtype
            out_size = float(grad.itemsize)
        else:
            out_size = NAN
    model = f"4 per element x {grad.numel} ({fmt_shape(grad.dims)})"
    if math.isnan(out_size):
        model += "; input_dtype not recorded, so the bytes written are NaN"
    return OpCost(flops=float(4 * grad.numel), bytes_read=float(grad.nbytes + out.nbytes),
                  bytes_written=grad.numel * out_size, dtype=grad.short, kind="reduction", model=model)


MODELS = {f"aten::{base}": reduction for base in _REDUCTIONS}
MODELS.update({f"aten::{base}": scan for base in _SCANS})
MODELS.update({f"aten::{base}_": scan for base in ("cumsum", "cumprod")})
MODELS.update({f"aten::{name}": softmax for name in ("softmax", "_softmax", "log_softmax", "_log_softmax")})
MODELS.update({name: softmax_backward for name in ("aten::_softmax_backward_data", "aten::_log_softmax_backward_data")})
