"""Convolutions with a bias that the batch norm right after them cancels.

BatchNorm subtracts each channel's mean, so a per-channel bias added by the convolution
before it comes out again: the model computes it forward and its gradient backward for
nothing. On the main thread's top-level operators (recorded with shapes) that is an
``aten::conv1d/2d/3d`` whose third argument (the bias) is a tensor, followed directly by
an ``aten::batch_norm`` over the convolution's output. The rule
conv-bias-before-batchnorm reads this table.
"""

from __future__ import annotations

from math import prod

import numpy as np
import pandas as pd

from advisor.knowledge.costs._model import Args, Uncostable
from advisor.session import text
from advisor.step.facts import Facts
from advisor.tables._registry import table

CONVS = ("aten::conv1d", "aten::conv2d", "aten::conv3d")
NORM = "aten::batch_norm"


def _shapes(row) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int] | None:
    """(input, weight, bias) sizes and the element size of a conv call; None without a bias."""
    try:
        args = Args(row.input_dims, row.input_types)
        x, weight = args.tensor(0), args.tensor(1)
    except Uncostable:
        return None
    bias = args.opt_tensor(2)
    if bias is None or not bias.dims:
        return None
    return x.dims, weight.dims, bias.dims, x.itemsize


@table(
    "conv_bias",
    title="Convolution Bias Before Batch Norm",
    description=(
        "Convolutions called with a bias (its third argument a tensor) whose next top-level "
        "operator on the main thread is a batch norm over their output, which cancels the "
        "bias. Grouped by the convolution's shapes. Needs shapes recorded (record_shapes): "
        "empty without them."
    ),
    key="the convolution's input dims, e.g. 'aten::conv2d [[32,3,32,32],[64,3,3,3],[64]]'",
    columns={
        "layer": "the layer as written: Conv2d(in, out, kernel) on the input's sizes.",
        "calls": "such convolutions in the window.",
        "calls_per_step": "calls per step (NaN without steps).",
        "channels": "output channels (the bias's length).",
        "output_bytes": "bytes of one call's output (the batch norm's input).",
        "bytes_per_step": "output bytes of all such calls per step (NaN without steps).",
        "example_event": "the row id of one such convolution.",
    },
)
def conv_bias_table(f: Facts) -> pd.DataFrame:
    columns = ["layer", "calls", "calls_per_step", "channels", "output_bytes", "bytes_per_step", "example_event"]
    empty = pd.DataFrame({c: pd.Series(dtype="object" if c == "layer" else "float64")
                          for c in columns}).rename_axis("key")
    if f.main_thread is None or f.window_ns <= 0:
        return empty
    lo, hi = f.window
    top = f.main_ops
    # BatchNorm in training counts its batches first (num_batches_tracked += 1: an
    # aten::add_ on 0-dim tensors, between the convolution and the norm): skip those.
    dims = text(top["input_dims"])
    counter = (text(top["name"]) == "aten::add_") & (dims == "[[],[],[]]")
    top = top[~counter]
    names = text(top["name"])
    starts = top["start_ns"].to_numpy()
    candidates = np.flatnonzero(np.isin(names[:-1], CONVS) & (names[1:] == NORM) & (starts[:-1] >= lo)
                                & (starts[:-1] < hi))
    rows = []
    for i in candidates:
        conv, norm = top.iloc[i], top.iloc[i + 1]
        shapes = _shapes(conv)
        if shapes is None:
            continue
        x, weight, bias, itemsize = shapes
        try:
            normed = Args(norm.input_dims, norm.input_types).tensor(0).dims
        except Uncostable:
            continue
        # The batch norm reads this convolution's output: same batch, the bias's channels.
        if len(normed) < 2 or normed[0] != x[0] or normed[1] != weight[0] or bias[0] != weight[0]:
            continue
        key = f"{names[i]} {str(conv.input_dims).replace(', ', ',')}"
        kernel = "x".join(str(k) for k in weight[2:])
        layer = f"Conv{len(weight) - 2}d({weight[1]}, {weight[0]}, kernel {kernel}) on {'x'.join(map(str, x))}"
        rows.append((key, layer, int(weight[0]), prod(normed) * itemsize, int(top.index[i])))
    if not rows:
        return empty
    found = pd.DataFrame(rows, columns=["key", "layer", "channels", "output_bytes", "example_event"])
    out = found.groupby("key", sort=False).agg(calls=("channels", "size"), layer=("layer", "first"),
                                                channels=("channels", "first"),
                                                output_bytes=("output_bytes", "first"),
                                                example_event=("example_event", "first"))
    steps = len(f.steps) if f.has_steps else 0
    out["calls_per_step"] = out["calls"] / steps if steps else np.nan
    out["bytes_per_step"] = out["calls_per_step"] * out["output_bytes"]
    out.index.name = "key"
    return out.sort_values("bytes_per_step", ascending=False, kind="stable")[columns]
