"""Normalisations: layer norm, batch norm (native, cuDNN, MIOpen and the newer
_native_batch_norm_legit / _batch_norm_with_update spellings), group norm, RMS norm, and
their backward ops.

FLOPs per element, textbook counts (each +, -, *, / and square root one):
    statistics (training batch norm, layer norm, group norm): mean 1 + variance 3
    normalise (x - mean) * rstd: 2; affine: 1 for the weight, 1 for the bias
    RMS norm: square 1, sum 1, scale 1, weight 1
    backward: x_hat 2; grad input 9 more (two row sums and the combination); grad
    weight 2; grad bias 1 (layer/batch/group norm); RMS norm: grad input 5 + x_hat 1,
    grad weight 2
Bytes: input, weight, bias and statistics read once; output and saved statistics
(mean/rstd in fp32, fp64 for fp64 inputs) written once.
"""

from __future__ import annotations

from advisor.knowledge.costs._model import (
    NAN,
    Arg,
    Args,
    OpCost,
    fmt_shape,
    prod,
    uncostable,
)


def _acc_size(x: Arg) -> int:
    return 8 if x.short == "fp64" else 4


def _affine(args: Args, weight_at: int | None, bias_at: int | None) -> tuple[Arg | None, Arg | None]:
    weight = args.opt_tensor(weight_at) if weight_at is not None else None
    bias = args.opt_tensor(bias_at) if bias_at is not None else None
    return weight, bias


def _mask(value, default: tuple[bool, ...]) -> tuple[tuple[bool, ...], bool]:
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, bool) for v in value):
        return tuple(value) + (False,) * (len(default) - len(value)), True
    return default, False


def _normalized_size(args: Args, x: Arg, shape_at: int, weight: Arg | None, bias: Arg | None) -> int | None:
    for t in (weight, bias):
        if t is not None:
            return t.numel
    shape = args.value(shape_at)
    if isinstance(shape, (list, tuple)) and all(type(v) is int for v in shape):
        return prod(shape)
    return None


def layer_norm(name: str, args: Args) -> OpCost:
    """layer_norm / native_layer_norm(input, normalized_shape, weight, bias, eps)."""
    x = args.tensor(0)
    weight, bias = _affine(args, 2, 3)
    d = _normalized_size(args, x, 1, weight, bias)
    per = 6 + (weight is not None) + (bias is not None)
    reads = [x] + [t for t in (weight, bias) if t is not None]
    if d is None:
        stats, rows_text = NAN, "rows unknown (normalized_shape not recorded)"
    else:
        if d == 0 or x.numel % d:
            raise uncostable("normalized_shape does not divide the input")
        stats = 2 * (x.numel // d) * _acc_size(x)
        rows_text = f"{x.numel // d} rows of {d}"
    return OpCost(flops=float(per * x.numel), bytes_read=float(sum(t.nbytes for t in reads)),
                  bytes_written=float(x.numel * x.itemsize + stats), dtype=x.short, kind="norm",
                  model=f"layer norm: {per} per element x {x.numel} ({fmt_shape(x.dims)}), {rows_text}; "
                        "writes output, mean and rstd")


def layer_norm_backward(name: str, args: Args) -> OpCost:
    """native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight,
    bias, output_mask)."""
    grad, x, mean, rstd = args.tensor(0), args.tensor(1), args.tensor(3), args.tensor(4)
    if grad.dims != x.dims:
        raise uncostable("grad_out and input differ in shape")
    weight, bias = _affine(args, 5, 6)
    mask, recorded = _mask(args.value(7), (True, weight is not None, bias is not None))
    d = _normalized_size(args, x, 2, weight, bias)
    return _norm_backward("layer norm", x, [grad, x, mean, rstd] + ([weight] if weight is not None else []),
                          mask, recorded, d, weight, bias)


def _norm_backward(what: str, x: Arg, reads: list[Arg], mask, recorded: bool, param_size: int | None,
                   weight: Arg | None, bias: Arg | None, *, grad_input_per: int = 9) -> OpCost:
    want_input, want_weight, want_bias = mask[0], mask[1], mask[2]
    per = (2 if (want_input or want_weight) else 0) + grad_input_per * want_input + 2 * want_weight + want_bias
    written = x.numel * x.itemsize if want_input else 0
    for wanted, t in ((want_weight, weight), (want_bias, bias)):
        if wanted:
            if t is not None:
                written += t.numel * t.itemsize
            elif param_size is not None:
                written += param_size * x.itemsize
            else:
                written = NAN
    parts = [label for label, on in zip(("grad input", "grad weight", "grad bias"), mask) if on]
    model = f"{what} backward ({', '.join(parts) or 'nothing'}): {per} per element x {x.numel} ({fmt_shape(x.dims)})"
    if not recorded:
        model += "; output_mask not recorded: every gradient with a parameter counted"
    return OpCost(flops=float(per * x.numel), bytes_read=float(sum(t.nbytes for t in reads)),
                  bytes_written=float(written), dtype=x.short, kind="norm", model=model)


# name -> (position of the training flag, or a bool the op implies)
_BATCH_NORMS = {
    "aten::batch_norm": 5, "aten::_batch_norm_impl_index": 5, "aten::native_batch_norm": 5,
    "aten::cudnn_batch_norm": 5, "aten::miopen_batch_norm": 5, "aten::_native_batch_norm_legit": 5,
    "aten::_native_batch_norm_legit_no_training": False, "aten::_batch_norm_with_update": True,
    "aten::_batch_norm_no_update": False,
}


def batch_norm(name: str, args: Args) -> OpCost:
    """batch_norm and its backends: (input, weight, bias, running_mean, running_var,
    training, momentum, eps); _native_batch_norm_legit.no_stats has no running stats."""
    x = args.tensor(0)
    if len(x.dims) < 2:
        raise uncostable("batch norm input without a channel dim")
    channels = x.dims[1]
    training_at = _BATCH_NORMS[name]
    no_stats = name == "aten::_native_batch_norm_legit" and len(args) == 6
    if no_stats:
        training_at = 3
    note = ""
    if isinstance(training_at, bool):
        training = training_at
    else:
        training = args.value(training_at)
        if not isinstance(training, bool):
            training = True
            note = "; training flag not recorded: counted as training"
    weight, bias = _affine(args, 1, 2)
    running = [] if no_stats else [t for t in (args.opt_tensor(3), args.opt_tensor(4)) if t is not None]
    for t in (weight, bias):
        if t is not None and t.numel != channels:
            raise uncostable("weight/bias size differs from the channels")
    per = 2 + (weight is not None) + (bias is not None) + (4 if training else 0)
    reads = [x] + [t for t in (weight, bias) if t is not None] + running
    written = x.numel * x.itemsize
    if training:
        written += 2 * channels * _acc_size(x)  # saved mean and invstd
        written += sum(t.nbytes for t in running)  # running stats updated in place
    model = (f"batch norm ({'training' if training else 'inference'}): {per} per element x {x.numel} "
             f"({fmt_shape(x.dims)}), {channels} channels{note}")
    return OpCost(flops=float(per * x.numel), bytes_read=float(sum(t.nbytes for t in reads)),
                  bytes_written=float(written), dtype=x.short, kind="norm", model=model)


def batch_norm_backward(name: str, args: Args) -> OpCost:
    """native_batch_norm_backward / batch_norm_backward(grad_out, input, weight,
    running_mean, running_var, save_mean, save_invstd, train, eps, output_mask[, reserve])
    and cudnn/miopen_batch_norm_backward(input, grad_output, weight, ...), which compute
    all three gradients."""
    if name in ("aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward"):
        x, grad = args.tensor(0), args.tensor(1)
        mask, recorded = (True, True, True), True
        train = True
    else:
        grad, x = args.tensor(0), args.tensor(1)
        weight_present = args.opt_tensor(2) is not None
        mask, recorded = _mask(args.value(9), (True, weight_present, weight_present))
        train = args.value(7)
        train = train if isinstance(train, bool) else True
    if grad.dims != x.dims or len(x.dims) < 2:
        raise uncostable("grad_output and input differ in shape")
    weight = args.opt_tensor(2)
    saved = [t for t in (args.opt_tensor(5), args.opt_tensor(6)) if t is not None]
    reads = [grad, x] + ([weight] if weight is not None else []) + saved
    channels = x.dims[1]
    # in inference the statistics are constants: grad input is grad * weight * invstd
    return _norm_backward("batch norm", x, reads, mask, recorded, channels, weight, weight,
                          grad_input_per=9 if train else 0)


def group_norm(name: str, args: Args) -> OpCost:
    """native_group_norm(input, weight, bias, N, C, HxW, group, eps) and
    group_norm(input, num_groups, weight, bias, eps, cudnn_enabled)."""
    x = args.tensor(0)
    if name == "aten::group_norm":
        weight, bias = _affine(args, 2, 3)
        groups = args.value(1)
    else:
        weight, bias = _affine(args, 1, 2)
        groups = args.value(6)
    if not x.dims:
        raise uncostable("group norm of a zero-dim tensor")
    per = 6 + (weight is not None) + (bias is not None)
    reads = [x] + [t for t in (weight, bias) if t is not None]
    written = x.numel * x.itemsize
    note = ""
    if type(groups) is int and groups > 0:
        written += 2 * x.dims[0] * groups * _acc_size(x)
    else:
        written = NAN
        note = "; the number of groups is not recorded, so the statistics' bytes are unknown"
    return OpCost(flops=float(per * x.numel), bytes_read=float(sum(t.nbytes for t in reads)),
                  bytes_written=float(written), dtype=x.short, kind="norm",
                  model=f"group norm: {per} per element x {x.numel} ({fmt_shape(x.dims)}){note}")


def group_norm_backward(name: str, args: Args) -> OpCost:
    """native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
    output_mask)."""
    grad, x, mean, rstd = args.tensor(0), args.tensor(1), args.tensor(2), args.tensor(3)
    if grad.dims != x.dims or len(x.dims) < 2:
        raise uncostable("grad_out and input differ in shape")
    weight = args.opt_tensor(4)
    mask, recorded = _mask(args.value(9), (True, weight is not None, weight is not None))
    reads = [grad, x, mean, rstd] + ([weight] if weight is not None else [])
    return _norm_backward("group norm", x, reads, mask, recorded, x.dims[1], weight, weight)


def rms_norm(name: str, args: Args) -> OpCost:
    """rms_norm / _fused_rms_norm(input, normalized_shape, weight, eps); the fused op also
    writes the rstd of each row."""
    x = args.tensor(0)
    weight = args.opt_tensor(2)
    per = 3 + (weight is not None)
    written = float(x.numel * x.itemsize)
    rows_text = ""
    if name == "aten::_fused_rms_norm":
        d = _normalized_size(args, x, 1, weight, None)
        if d is None:
            written = NAN
            rows_text = "; rows unknown (normalized_shape not recorded)"
        else:
            if d == 0 or x.numel % d:
                raise uncostable("normalized_shape does not divide the input")
            written += (x.numel // d) * _acc_size(x)
    reads = [x] + ([weight] if weight is not None else [])
    return OpCost(flops=float(per * x.numel), bytes_read=float(sum(t.nbytes for t in reads)),
                  bytes_written=written, dtype=x.short, kind="norm",
                  model=f"RMS norm: {per} per element x {x.numel} ({fmt_shape(x.dims)}){rows_text}")


def rms_norm_backward(name: str, args: Args) -> OpCost:
    """_fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight,
    output_mask[2])."""
    grad, x, rstd = args.tensor(0), args.tensor(1), args.tensor(3)
    if grad.dims != x.dims:
        raise uncostable("grad_out and input differ in shape")
    weight = args.opt_tensor(4)
    mask, recorded = _mask(args.value(5), (True, weight is not None))
    want_input, want_weight = mask[0], mask[1]
    per = (1 if (want_input or want_weight) else 0) + 5 * want_input + 2 * want_weight
    written = (x.numel * x.itemsize if want_input else 0)
    if want_weight:
        written += weight.numel * weight.itemsize if weight is not None else NAN
    reads = [grad, x, rstd] + ([weight] if weight is not None else [])
    model = f"RMS norm backward: {per} per element x {x.numel} ({fmt_shape(x.dims)})"
    if not recorded:
        model += "; output_mask not recorded: grad input and grad weight counted"
    return OpCost(flops=float(per * x.numel), bytes_read=float(sum(t.nbytes for t in reads)),
                  bytes_written=float(written), dtype=x.short, kind="norm", model=model)


MODELS = {
    "aten::layer_norm": layer_norm,
    "aten::native_layer_norm": layer_norm,
    "aten::native_layer_norm_backward": layer_norm_backward,
    "aten::group_norm": group_norm,
    "aten::native_group_norm": group_norm,
    "aten::native_group_norm_backward": group_norm_backward,
    "aten::rms_norm": rms_norm,
    "aten::_fused_rms_norm": rms_norm,
    "aten::_fused_rms_norm_backward": rms_norm_backward,
    "aten::native_batch_norm_backward": batch_norm_backward,
    "aten::batch_norm_backward": batch_norm_backward,
    "aten::cudnn_batch_norm_backward": batch_norm_backward,
    "aten::miopen_batch_norm_backward": batch_norm_backward,
}
MODELS.update({name: batch_norm for name in _BATCH_NORMS})
