"""Convolutions, forward and backward, in every spelling a trace uses (conv2d,
convolution, _convolution, cudnn_convolution, mkldnn_convolution, the slow CPU paths,
convolution_backward, cudnn_convolution_backward...).

FLOPs follow torch.utils.flop_counter: 2 * N * C_out * prod(output spatial) * C_in/groups *
prod(kernel) for a forward convolution (padding taps included, bias not counted), and as
much again for each of grad input and grad weight. One deliberate difference: flop_counter
counts the grad weight of a grouped convolution ``groups`` times over (it treats the
weight gradient as one ungrouped convolution); here it is counted once, as computed.

The output size needs stride, padding and dilation, which only newer traces record (in
"Concrete Inputs"). Without them the output size comes from the caller (``output_spatial``:
costs_for_ops takes it from the backward of the same convolution, whose grad_output has
it) or stays unknown: flops and bytes written are NaN, and the model says why. The
backward ops need none of it: grad_output carries the output size.
"""

from __future__ import annotations

import math

from advisor.knowledge.costs._model import (
    LIST_TYPES_SPELLING,
    MISSING,
    NAN,
    Args,
    OpCost,
    compute_dtype,
    fmt_shape,
    prod,
    uncostable,
)

# Position of each argument per op. "transposed" is a position, or the bool the op implies;
# "fixed_groups" is the groups the op implies; an argument the op lacks takes its default
# (stride 1, padding 0, dilation 1, output_padding 0).
_FORWARD: dict[str, dict] = {}
for _nd in ("1d", "2d", "3d"):
    _FORWARD[f"aten::conv{_nd}"] = {
        "bias": 2, "stride": 3, "padding": 4, "dilation": 5, "groups": 6, "transposed": False}
    _FORWARD[f"aten::conv_transpose{_nd}"] = {
        "bias": 2, "stride": 3, "padding": 4, "output_padding": 5, "groups": 6, "dilation": 7, "transposed": True}
for _name in ("aten::convolution", "aten::_convolution", "aten::convolution_overrideable"):
    _FORWARD[_name] = {
        "bias": 2, "stride": 3, "padding": 4, "dilation": 5, "transposed": 6, "output_padding": 7, "groups": 8}
_FORWARD["aten::cudnn_convolution"] = {"padding": 2, "stride": 3, "dilation": 4, "groups": 5, "transposed": False}
_FORWARD["aten::cudnn_convolution_transpose"] = {
    "padding": 2, "output_padding": 3, "stride": 4, "dilation": 5, "groups": 6, "transposed": True}
for _name in ("aten::miopen_convolution", "aten::miopen_depthwise_convolution", "aten::mkldnn_convolution"):
    _FORWARD[_name] = {"bias": 2, "padding": 3, "stride": 4, "dilation": 5, "groups": 6, "transposed": False}
_FORWARD["aten::miopen_convolution_transpose"] = {
    "bias": 2, "padding": 3, "output_padding": 4, "stride": 5, "dilation": 6, "groups": 7, "transposed": True}
for _name in ("aten::_slow_conv2d_forward", "aten::thnn_conv2d", "aten::slow_conv3d", "aten::slow_conv3d_forward"):
    _FORWARD[_name] = {"bias": 3, "stride": 4, "padding": 5, "transposed": False, "fixed_groups": 1}
for _name in ("aten::slow_conv_dilated2d", "aten::slow_conv_dilated3d"):
    _FORWARD[_name] = {"bias": 3, "stride": 4, "padding": 5, "dilation": 6, "transposed": False, "fixed_groups": 1}
for _name in ("aten::slow_conv_transpose2d", "aten::slow_conv_transpose3d"):
    _FORWARD[_name] = {
        "bias": 3, "stride": 4, "padding": 5, "output_padding": 6, "dilation": 7, "transposed": True, "fixed_groups": 1}
for _name in ("aten::_conv_depthwise2d", "aten::conv_depthwise3d"):
    _FORWARD[_name] = {"bias": 3, "stride": 4, "padding": 5, "dilation": 6, "transposed": False}
_FORWARD["aten::_nnpack_spatial_convolution"] = {
    "bias": 2, "padding": 3, "stride": 4, "transposed": False, "fixed_groups": 1}

# cudnn_convolution before torch 1.9 took a bias at position 2; shift the rest by one.
_WITH_OLD_BIAS = {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose"}

CONV_BACKWARD = (
    "aten::convolution_backward",
    "aten::convolution_backward_overrideable",
    "aten::cudnn_convolution_backward",
    "aten::miopen_convolution_backward",
    "aten::_slow_conv2d_backward",
    "aten::thnn_conv2d_backward",
)


def _spatial_list(value, nd: int, what: str):
    """A stride/padding/dilation value for ``nd`` spatial dims; None when unknown."""
    if value is MISSING or value is None:
        return None
    if type(value) is int:
        return (value,) * nd
    if isinstance(value, (list, tuple)) and all(type(v) is int for v in value):
        if len(value) == 1:
            return tuple(value) * nd
        if len(value) == nd:
            return tuple(value)
    if isinstance(value, str):
        return value  # "same" / "valid"
    raise uncostable(f"{what} {value!r} does not fit {nd} spatial dims")


def _geometry(args: Args):
    x, w = args.tensor(0), args.tensor(1)
    if len(w.dims) < 3:
        raise uncostable("weight has no spatial dims")
    nd = len(w.dims) - 2
    if len(x.dims) == nd + 1:  # unbatched input (conv2d accepts C, H, W)
        n, c_x, in_sp = 1, x.dims[0], x.dims[1:]
    elif len(x.dims) == nd + 2:
        n, c_x, in_sp = x.dims[0], x.dims[1], x.dims[2:]
    else:
        raise uncostable(f"input {fmt_shape(x.dims)} does not fit weight {fmt_shape(w.dims)}")
    return x, w, nd, n, c_x, tuple(in_sp)


def _value(args: Args, layout: dict, key: str, default):
    if key not in layout:
        return default
    return args.value(layout[key])


def conv_forward(name: str, args: Args, output_spatial: tuple | None = None) -> OpCost:
    layout = dict(_FORWARD[name])
    if name in _WITH_OLD_BIAS and len(args) > 2 and args.type(2) not in LIST_TYPES_SPELLING:
        # old signature (self, weight, bias, padding, ...): every position after 1 moves by one
        layout = {k: (v + 1 if type(v) is int and v >= 2 else v) for k, v in layout.items()}
        layout["bias"] = 2
    x, w, nd, n, c_x, in_sp = _geometry(args)
    kernel = tuple(w.dims[2:])
    notes = []

    transposed = layout["transposed"]
    if not isinstance(transposed, bool):
        recorded = args.value(transposed)
        if isinstance(recorded, bool):
            transposed = recorded
        else:
            forward_fits = w.dims[1] and c_x % w.dims[1] == 0
            transposed_fits = c_x == w.dims[0]
            if forward_fits:
                transposed = False
                if transposed_fits:
                    notes.append("transposed flag not recorded: taken as a forward convolution")
            elif transposed_fits:
                transposed = True
            else:
                raise uncostable("input channels fit neither a forward nor a transposed weight")

    groups = layout.get("fixed_groups")
    if groups is None and "groups" in layout:
        recorded = args.value(layout["groups"])
        groups = recorded if type(recorded) is int and recorded > 0 else None
    if transposed:
        if c_x != w.dims[0]:
            raise uncostable("transposed convolution: input channels differ from weight dim 0")
        c_out = w.dims[1] * groups if groups else None
    else:
        if w.dims[1] == 0 or c_x % w.dims[1]:
            raise uncostable("input channels are not a multiple of the weight's")
        derived = c_x // w.dims[1]
        if groups is not None and groups != derived:
            raise uncostable("groups disagree with the channels")
        groups = derived
        c_out = w.dims[0]

    out_sp = None
    how = ""
    stride = _spatial_list(_value(args, layout, "stride", 1), nd, "stride")
    padding = _spatial_list(_value(args, layout, "padding", 0), nd, "padding")
    dilation = _spatial_list(_value(args, layout, "dilation", 1), nd, "dilation")
    out_pad = _spatial_list(_value(args, layout, "output_padding", 0), nd, "output_padding")
    if stride is not None and padding is not None and dilation is not None and out_pad is not None \
            and not isinstance(stride, str) and not isinstance(dilation, str) and not isinstance(out_pad, str):
        if padding == "valid":
            padding = (0,) * nd
        if padding == "same":
            out_sp = tuple(-(-i // s) for i, s in zip(in_sp, stride))
        elif isinstance(padding, str):
            raise uncostable(f"padding {padding!r}")
        elif transposed:
            out_sp = tuple((i - 1) * s - 2 * p + d * (kk - 1) + op + 1
                           for i, s, p, d, kk, op in zip(in_sp, stride, padding, dilation, kernel, out_pad))
        else:
            out_sp = tuple((i + 2 * p - d * (kk - 1) - 1) // s + 1
                           for i, s, p, d, kk in zip(in_sp, stride, padding, dilation, kernel))
        how = f"stride {fmt_shape(stride)} padding {fmt_shape(padding)} dilation {fmt_shape(dilation)}"
        if output_spatial is not None and tuple(output_spatial) != out_sp:
            raise uncostable("the output size given disagrees with stride/padding/dilation")
    elif output_spatial is not None:
        out_sp = tuple(output_spatial)
        how = "output size from the backward of the same convolution"
    if out_sp is not None and any(o <= 0 for o in out_sp):
        raise uncostable("empty output")

    reads = [x, w]
    bias = args.opt_tensor(layout["bias"]) if "bias" in layout else None
    if bias is not None:
        reads.append(bias)
    bytes_read = float(sum(a.nbytes for a in reads))
    # a transposed convolution's work is per input position, a forward one's per output position
    positions = prod(in_sp) if transposed else (prod(out_sp) if out_sp is not None else None)
    flops = float(2 * n * positions * w.dims[0] * w.dims[1] * prod(kernel)) if positions is not None else NAN
    if out_sp is not None and c_out is not None:
        bytes_written = float(n * c_out * prod(out_sp) * x.itemsize)
    else:
        bytes_written = NAN
    if out_sp is None:
        notes.append("output size unknown: stride/padding/dilation not recorded (no Concrete Inputs)")
    elif c_out is None:
        notes.append("groups not recorded, so the output channels are unknown")
    formula = ("2*N*prod(input spatial)*C_in*C_out/groups*prod(kernel)" if transposed
               else "2*N*prod(output spatial)*C_out*C_in/groups*prod(kernel)")
    model = f"{'transposed ' if transposed else ''}conv: {formula}"
    model += f", N={n} input {fmt_shape(x.dims)} weight {fmt_shape(w.dims)}"
    if out_sp is not None:
        model += f" output spatial {fmt_shape(out_sp)} ({how})"
    if bias is not None:
        model += "; bias not counted in FLOPs"
    if notes:
        model += "; " + "; ".join(notes)
    c_in = c_x
    return OpCost(flops=flops, bytes_read=bytes_read, bytes_written=bytes_written,
                  dtype=compute_dtype(x.short, "conv"), kind="conv", model=model,
                  batch=n, c_in=c_in, c_out=c_out, kernel=kernel, out_spatial=out_sp, groups=groups)


def _mask(value) -> tuple[tuple[bool, bool, bool], bool]:
    """(grad input, grad weight, grad bias) wanted, and whether the trace recorded it."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, bool) for v in value):
        padded = tuple(value) + (False,) * (3 - len(value))
        return (padded[0], padded[1], padded[2]), True
    return (True, True, False), False


def conv_backward(name: str, args: Args) -> OpCost:
    """convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask) and the backend spellings
    (cudnn/miopen: self, grad_output, weight, padding, stride, dilation, groups, ...,
    output_mask; slow CPU: grad_output, self, weight, kernel_size, stride, padding,
    output_mask)."""
    if name in ("aten::convolution_backward", "aten::convolution_backward_overrideable"):
        g_idx, x_idx = 0, 1
        transposed = args.value(7)
        groups = args.value(9)
        mask_value = args.value(10)
        bias_sizes = args.value(3)
    elif name in ("aten::_slow_conv2d_backward", "aten::thnn_conv2d_backward"):
        g_idx, x_idx = 0, 1
        transposed, groups, bias_sizes = False, 1, None
        mask_value = args.value(6)
    else:  # cudnn / miopen: output_mask is the last argument
        g_idx, x_idx = 1, 0
        transposed = False
        groups = args.value(6)
        mask_value = args.value(len(args) - 1)
        bias_sizes = None
    grad, x, w = args.tensor(g_idx), args.tensor(x_idx), args.tensor(2)
    nd = len(w.dims) - 2
    if nd < 1 or len(grad.dims) != nd + 2 or len(x.dims) != nd + 2 or grad.dims[0] != x.dims[0]:
        raise uncostable("grad_output, input and weight do not fit together")
    n, c_in, in_sp = x.dims[0], x.dims[1], x.dims[2:]
    c_out, out_sp = grad.dims[1], grad.dims[2:]
    kernel = tuple(w.dims[2:])
    notes = []
    if not isinstance(transposed, bool):
        forward_fits = w.dims[0] == c_out and w.dims[1] and c_in % w.dims[1] == 0
        transposed_fits = w.dims[0] == c_in and w.dims[1] and c_out % w.dims[1] == 0
        if forward_fits:
            transposed = False
            if transposed_fits:
                notes.append("transposed flag not recorded: taken as a forward convolution")
        elif transposed_fits:
            transposed = True
        else:
            raise uncostable("channels fit neither a forward nor a transposed weight")
    if transposed:
        if w.dims[0] != c_in or not w.dims[1] or c_out % w.dims[1]:
            raise uncostable("transposed convolution channels do not match")
        derived = c_out // w.dims[1]
        positions = prod(in_sp)
    else:
        if w.dims[0] != c_out or not w.dims[1] or c_in % w.dims[1]:
            raise uncostable("convolution channels do not match")
        derived = c_in // w.dims[1]
        positions = prod(out_sp)
    if type(groups) is int and groups != derived:
        raise uncostable("groups disagree with the channels")
    groups = derived
    mask, recorded = _mask(mask_value)
    if not recorded:
        notes.append("output_mask not recorded: grad input and grad weight both counted")
    per_grad = 2 * n * positions * w.dims[0] * w.dims[1] * prod(kernel)
    flops = per_grad * (int(mask[0]) + int(mask[1]))
    bytes_read = grad.nbytes + (w.nbytes if mask[0] else 0) + (x.nbytes if mask[1] else 0)
    bytes_written = (x.numel * x.itemsize if mask[0] else 0) + (w.numel * w.itemsize if mask[1] else 0)
    if mask[2] and bias_sizes is not None:
        # the bias gradient sums grad_output, which is read already
        bytes_written += c_out * grad.itemsize
    which = [label for label, on in zip(("grad input", "grad weight", "grad bias"), mask) if on]
    model = (f"conv backward ({', '.join(which) or 'nothing'}): 2*N*prod({'input' if transposed else 'output'} "
             f"spatial)*C_out*C_in/groups*prod(kernel) per gradient, grad_output {fmt_shape(grad.dims)} "
             f"weight {fmt_shape(w.dims)}; grad bias not counted in FLOPs")
    if notes:
        model += "; " + "; ".join(notes)
    return OpCost(flops=float(flops), bytes_read=float(bytes_read), bytes_written=float(bytes_written),
                  dtype=compute_dtype(x.short, "conv"), kind="conv", model=model,
                  batch=n, c_in=c_in, c_out=c_out, kernel=kernel, out_spatial=tuple(out_sp), groups=groups)


def conv_backward_input(name: str, args: Args) -> OpCost:
    """cudnn_convolution_backward_input(self_size, grad_output, weight, padding, stride,
    dilation, groups, ...): the grad input alone (a forward convolution's)."""
    grad, w = args.tensor(1), args.tensor(2)
    nd = len(w.dims) - 2
    if nd < 1 or len(grad.dims) != nd + 2 or grad.dims[1] != w.dims[0]:
        raise uncostable("grad_output and weight do not fit together")
    n, c_out, out_sp = grad.dims[0], grad.dims[1], grad.dims[2:]
    flops = 2 * n * prod(out_sp) * w.dims[0] * w.dims[1] * prod(w.dims[2:])
    size = args.value(0)
    written = NAN
    if isinstance(size, (list, tuple)) and all(type(v) is int for v in size):
        written = float(prod(size) * grad.itemsize)
    groups = args.value(6)
    return OpCost(flops=float(flops), bytes_read=float(grad.nbytes + w.nbytes), bytes_written=written,
                  dtype=compute_dtype(grad.short, "conv"), kind="conv",
                  model=f"conv grad input: 2*N*prod(output spatial)*C_out*C_in/groups*prod(kernel), grad_output "
                        f"{fmt_shape(grad.dims)} weight {fmt_shape(w.dims)}"
                        + ("; input size not recorded, bytes written unknown" if math.isnan(written) else ""),
                  batch=n, c_in=w.dims[1] * groups if type(groups) is int else None, c_out=c_out,
                  kernel=tuple(w.dims[2:]), out_spatial=tuple(out_sp),
                  groups=groups if type(groups) is int else None)


def conv_backward_weight(name: str, args: Args) -> OpCost:
    """cudnn_convolution_backward_weight(weight_size, grad_output, self, padding, stride,
    dilation, groups, ...): the grad weight alone; needs the weight size, which only
    Concrete Inputs record."""
    grad, x = args.tensor(1), args.tensor(2)
    nd = len(x.dims) - 2
    if nd < 1 or len(grad.dims) != nd + 2 or grad.dims[0] != x.dims[0]:
        raise uncostable("grad_output and input do not fit together")
    n, c_out, out_sp = grad.dims[0], grad.dims[1], grad.dims[2:]
    size = args.value(0)
    groups = args.value(6)
    read = float(grad.nbytes + x.nbytes)
    if isinstance(size, (list, tuple)) and len(size) == nd + 2 and all(type(v) is int for v in size):
        flops = float(2 * n * prod(out_sp) * prod(size))
        written = float(prod(size) * grad.itemsize)
        kernel = tuple(size[2:])
        model = (f"conv grad weight: 2*N*prod(output spatial)*C_out*C_in/groups*prod(kernel), grad_output "
                 f"{fmt_shape(grad.dims)} weight {fmt_shape(size)}")
    else:
        flops, written, kernel = NAN, NAN, None
        model = ("conv grad weight: the weight size is not recorded (no Concrete Inputs), so neither FLOPs nor "
                 "bytes written are known")
    return OpCost(flops=flops, bytes_read=read, bytes_written=written,
                  dtype=compute_dtype(x.short, "conv"), kind="conv", model=model,
                  batch=n, c_in=x.dims[1], c_out=c_out, kernel=kernel, out_spatial=tuple(out_sp),
                  groups=groups if type(groups) is int else None)


def backward_output_hint(name: str, args: Args) -> tuple[tuple, tuple, tuple] | None:
    """(input dims, weight dims, output spatial) that a conv backward row reveals about
    its forward: the forward's output size is the grad_output's."""
    if name not in CONV_BACKWARD:
        return None
    if name in ("aten::convolution_backward", "aten::convolution_backward_overrideable",
                "aten::_slow_conv2d_backward", "aten::thnn_conv2d_backward"):
        g_idx, x_idx = 0, 1
    else:
        g_idx, x_idx = 1, 0
    grad, x, w = args.opt_tensor(g_idx), args.opt_tensor(x_idx), args.opt_tensor(2)
    if grad is None or x is None or w is None or len(grad.dims) < 3:
        return None
    return tuple(x.dims), tuple(w.dims), tuple(grad.dims[2:])


MODELS = {name: conv_forward for name in _FORWARD}
MODELS.update({name: conv_backward for name in CONV_BACKWARD})
MODELS["aten::cudnn_convolution_backward_input"] = conv_backward_input
MODELS["aten::cudnn_convolution_backward_weight"] = conv_backward_weight
FORWARD_NAMES = frozenset(_FORWARD)
