"""Elementwise ops (add, mul, relu, gelu, silu, sigmoid, where...), their backward ops
(threshold_backward, gelu_backward...), in-place and out= variants, and the _foreach_
and fused optimizer ops that apply them over lists of tensors.

FLOPs are output elements times a per-op count that follows the textbook formula, each
+, -, *, /, comparison or select and each transcendental function (exp, log, erf, tanh,
sqrt...) counted as one: sigmoid 1/(1+exp(-x)) is 4, silu x*sigmoid(x) 5, gelu
x/2*(1+erf(x/sqrt 2)) 5 (9 for the tanh form). The counts are in ``POINTWISE`` below.
Bytes: each distinct element of each tensor operand read once (a broadcast operand is
read at its own size, a stride-0 dimension once), the output written once.
torch.utils.flop_counter counts none of these ops.
"""

from __future__ import annotations

from advisor.knowledge.costs._model import (
    NAN,
    Args,
    OpCost,
    broadcast,
    category,
    fmt_shape,
    itemsize_of,
    prod,
    result_dtype,
    uncostable,
)

PROMOTE, BOOL, FLOAT, FIRST, NOT_FIRST = "promote", "bool", "float", "first", "not-first"

# base name -> (operands: how many leading arguments are the op's inputs, a tensor after
# them being an out= argument; FLOPs per output element; result dtype rule)
POINTWISE: dict[str, tuple[int, int, str]] = {}


def _add(names: str, operands: int, flops: int, result: str) -> None:
    for name in names.split():
        POINTWISE[name] = (operands, flops, result)


_add("add sub rsub", 3, 1, PROMOTE)  # self, other, alpha (a second FLOP where alpha != 1)
_add("mul remainder fmod maximum minimum fmax fmin floor_divide pow copysign heaviside nextafter"
     " bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift"
     " __and__ __or__ __xor__ __lshift__ __rshift__", 2, 1, PROMOTE)
_add("div true_divide", 3, 1, FLOAT)  # self, other, rounding_mode
_add("atan2 hypot", 2, 1, FLOAT)
_add("xlogy", 2, 2, FLOAT)
_add("logaddexp", 2, 4, FLOAT)
_add("eq ne lt le gt ge logical_and logical_or logical_xor", 2, 1, BOOL)
_add("abs neg sign sgn floor ceil round trunc frac relu square bitwise_not positive", 1, 1, PROMOTE)
_add("clamp_min clamp_max", 2, 1, PROMOTE)
_add("leaky_relu", 2, 2, PROMOTE)  # compare, multiply
_add("threshold", 3, 1, PROMOTE)
_add("hardtanh clamp", 3, 2, PROMOTE)
_add("relu6", 1, 2, PROMOTE)
_add("nan_to_num", 4, 3, PROMOTE)
_add("sqrt rsqrt exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh"
     " asinh acosh atanh erf erfc erfinv reciprocal", 1, 1, FLOAT)
_add("sigmoid", 1, 4, FLOAT)  # exp(-x): 2, +1, reciprocal
_add("silu", 1, 5, FLOAT)
_add("mish", 1, 5, FLOAT)  # x * tanh(log1p(exp(x)))
_add("hardswish", 1, 5, FLOAT)  # x * clamp(x + 3, 0, 6) / 6
_add("hardsigmoid", 1, 4, FLOAT)
_add("logit", 2, 3, FLOAT)
_add("gelu", 2, 5, FLOAT)  # self, approximate: 9 for "tanh" where recorded
_add("elu", 4, 4, FLOAT)  # compare, exp, -1, *alpha
_add("selu celu", 1, 5, FLOAT)
_add("softplus", 3, 5, FLOAT)  # *beta, exp, log1p, /beta, threshold compare
_add("logical_not isnan isinf isfinite isneginf isposinf signbit", 1, 1, BOOL)
_add("where", 3, 1, NOT_FIRST)  # condition, self, other
_add("masked_fill", 3, 1, FIRST)
_add("lerp", 3, 3, PROMOTE)  # self + weight * (end - self)
_add("addcmul addcdiv", 4, 3, PROMOTE)  # self + value * t1 (*|/) t2
# backward ops: the result has the gradient's dtype
_add("threshold_backward", 3, 1, FIRST)
_add("gelu_backward", 3, 11, FIRST)  # 19 for the tanh form
_add("silu_backward", 2, 9, FIRST)
_add("sigmoid_backward tanh_backward", 2, 3, FIRST)
_add("hardtanh_backward", 4, 2, FIRST)
_add("leaky_relu_backward", 4, 2, FIRST)
_add("elu_backward", 6, 3, FIRST)
_add("softplus_backward", 4, 5, FIRST)
_add("hardswish_backward", 2, 4, FIRST)
_add("hardsigmoid_backward", 2, 2, FIRST)
_add("mish_backward", 2, 14, FIRST)
_add("native_dropout_backward", 3, 2, FIRST)  # grad * mask * scale
_add("fill", 2, 0, FIRST)  # writes only
_add("zero", 1, 0, FIRST)

_TANH_GELU = {"gelu": 9, "gelu_backward": 19}


def _base(name: str) -> tuple[str, bool]:
    """("add", in place?) for aten::add / aten::add_."""
    base = name.removeprefix("aten::")
    if base.endswith("_") and not base.endswith("__"):
        return base[:-1], True
    return base, False


def pointwise(name: str, args: Args) -> OpCost:
    base, inplace = _base(name)
    operands, per_element, rule = POINTWISE[base]
    inputs = [args[i] for i in range(min(operands, len(args)))]
    tensors = [a for a in inputs if a.is_tensor]
    if not tensors:
        raise uncostable("no tensor operand recorded")
    writes_only = base in ("fill", "zero")
    if inplace or writes_only:
        self_ = args.tensor(0)
        out_shape = self_.dims
        if broadcast([t.dims for t in tensors]) != tuple(out_shape):
            raise uncostable("in-place operands do not broadcast to self's shape")
        out_dtype = self_.short
    else:
        out_shape = broadcast([t.dims for t in tensors])
        if rule == BOOL:
            out_dtype = "bool"
        elif rule == FIRST:
            out_dtype = args.tensor(0).short
        elif rule == NOT_FIRST:
            out_dtype = result_dtype([a for a in inputs[1:]])
        else:
            out_dtype = result_dtype(inputs)
            if rule == FLOAT and category(out_dtype) < 2:
                out_dtype = "fp32"  # integer inputs give the default float dtype
    elements = prod(out_shape)
    notes = []
    if base in ("add", "sub", "rsub"):
        alpha = args.value(2)
        if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha != 1:
            per_element = 2
    if base in _TANH_GELU:
        approximate = args.value(1 if base == "gelu" else 2)
        if approximate == "tanh":
            per_element = _TANH_GELU[base]
        elif approximate != "none":
            notes.append("approximate= not recorded: counted as the erf form")
    reads = [] if writes_only else tensors
    bytes_read = sum(t.nbytes for t in reads)
    bytes_written = elements * itemsize_of(out_dtype)
    model = f"{per_element} per output element x {elements} ({fmt_shape(out_shape)})"
    if writes_only:
        model = f"writes {elements} elements ({fmt_shape(out_shape)}), no arithmetic"
    if notes:
        model += "; " + "; ".join(notes)
    # a comparison computes in its operands' dtype, whatever it returns
    dtype = result_dtype(tensors) if rule == BOOL else out_dtype
    return OpCost(flops=float(per_element * elements), bytes_read=float(bytes_read),
                  bytes_written=float(bytes_written), dtype=dtype, kind="elementwise", model=model)


def native_dropout(name: str, args: Args) -> OpCost:
    """native_dropout(input, p, train) -> (output, mask): a random compare and a scaled
    multiply per element; the mask is one byte per element."""
    x = args.tensor(0)
    return OpCost(flops=float(2 * x.numel), bytes_read=float(x.nbytes),
                  bytes_written=float(x.numel * (x.itemsize + 1)), dtype=x.short, kind="elementwise",
                  model=f"2 per element x {x.numel} (random compare, scale); writes output and a bool mask")


# _foreach_ ops name their elementwise base; those not here are not costed.
_FOREACH_SPECIAL = {"copy": (2, 0, FIRST), "norm": (1, 2, FIRST)}
# Fused optimizers: FLOPs per parameter element of the update (Adam: the two moment
# updates 7, the bias-corrected step 6, weight decay 2), lists read and written.
_FUSED_OPTIMIZERS = {
    "aten::_fused_adam": 15, "aten::_fused_adam_": 15, "aten::_fused_adamw": 15, "aten::_fused_adamw_": 15,
    "aten::_fused_sgd": 3, "aten::_fused_sgd_": 3,  # weight decay, momentum, step
}


def foreach(name: str, args: Args) -> OpCost:
    """_foreach_<op>[_](self list, other...): the elementwise op over every tensor of the
    list. The profiler records each list's sizes but not its dtype, so the FLOPs are known
    and the bytes are not."""
    base, _inplace = _base(name.replace("_foreach_", "", 1))
    spec = _FOREACH_SPECIAL.get(base) or POINTWISE.get(base)
    if spec is None:
        raise uncostable(f"no model for _foreach_{base}")
    first = args[0]
    if not first.is_tensor_list:
        raise uncostable("first argument is not a recorded TensorList")
    elements = sum(prod(d) for d in first.dims)
    per_element = spec[1]
    flops = float(per_element * elements)
    return OpCost(flops=flops, bytes_read=NAN, bytes_written=NAN, dtype="", kind="elementwise",
                  model=f"{per_element} per element x {elements} over {len(first.dims)} tensors; "
                        "list dtypes are not recorded, so the bytes are unknown")


def fused_optimizer(name: str, args: Args) -> OpCost:
    per_element = _FUSED_OPTIMIZERS[name]
    first = args[0]
    if not first.is_tensor_list:
        raise uncostable("first argument is not a recorded TensorList")
    elements = sum(prod(d) for d in first.dims)
    return OpCost(flops=float(per_element * elements), bytes_read=NAN, bytes_written=NAN, dtype="",
                  kind="elementwise",
                  model=f"{per_element} per parameter element x {elements}; list dtypes are not recorded, "
                        "so the bytes are unknown")


MODELS = {f"aten::{base}": pointwise for base in POINTWISE}
MODELS.update({f"aten::{base}_": pointwise for base in POINTWISE if not base.startswith("__")})
MODELS["aten::native_dropout"] = native_dropout
MODELS.update({f"aten::_foreach_{base}{suffix}": foreach
               for base in (*POINTWISE, *_FOREACH_SPECIAL) for suffix in ("", "_") if not base.startswith("__")})
MODELS.update({name: fused_optimizer for name in _FUSED_OPTIMIZERS})
# fill/zero have only the in-place spelling in aten
MODELS.pop("aten::fill", None)
MODELS.pop("aten::zero", None)
