"""Op cost models: FLOPs agree with torch.utils.flop_counter on the same ops and shapes,
the profiler's own spelling of shapes and dtypes is read right (a real CPU trace, loaded
with advisor.importers.load), bytes match hand counts, and what cannot be costed is not.
"""

from __future__ import annotations

import ast
import json
import math

import numpy as np
import pandas as pd
import pytest
from conftest import shared_trace
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from advisor.knowledge.costs import (
    COST_COLUMNS,
    cost_groups,
    costed_names,
    costs_for_ops,
    kernel_costs,
    op_cost,
)
from advisor.knowledge.costs._model import SCALAR_TYPES

torch = pytest.importorskip("torch")
F = torch.nn.functional
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# torch dtype -> the profiler's "Input type" spelling (checked against a real trace in
# test_describe_matches_the_profiler) and its ScalarType code in "Concrete Inputs".
SPELLING = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool", torch.uint64: "long unsigned int",
}
CODE = {dtype: next(code for code, spelled in SCALAR_TYPES.items() if spelled == name)
        for dtype, name in SPELLING.items()}
MEMORY_FORMAT = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2}


def describe(values) -> tuple[list, list, list, list]:
    """Input Dims, Input type, Input Strides and Concrete Inputs for these argument values,
    spelled as torch.profiler spells them."""
    columns = ([], [], [], [])
    for v in values:
        if isinstance(v, torch.Tensor):
            entry = (list(v.shape), SPELLING[v.dtype], list(v.stride()), "")
        elif isinstance(v, (list, tuple)) and v and all(isinstance(t, torch.Tensor) for t in v):
            entry = ([list(t.shape) for t in v], "TensorList", [list(t.stride()) for t in v], "")
        elif isinstance(v, (list, tuple)):
            entry = ([], "ScalarList", [], str(list(v)))
        elif isinstance(v, (bool, int, float)):
            entry = ([], "Scalar", [], repr(v))
        elif isinstance(v, torch.dtype):
            entry = ([], "Scalar", [], str(CODE[v]))
        elif isinstance(v, torch.memory_format):
            entry = ([], "Scalar", [], str(MEMORY_FORMAT[v]))
        else:  # None, strings, devices, layouts
            entry = ([], "", [], "")
        for column, value in zip(columns, entry):
            column.append(value)
    return columns


class Recorder(TorchDispatchMode):
    """Every aten op call below autograd, with all its schema arguments (defaults filled
    in, as the profiler records them), described as the profiler would."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        values = []
        for i, argument in enumerate(func._schema.arguments):
            if i < len(args) and not argument.kwarg_only:
                values.append(args[i])
            elif argument.name in kwargs:
                values.append(kwargs[argument.name])
            else:
                values.append(argument.default_value if argument.has_default_value() else None)
        self.calls.append(("aten::" + func._schema.name.split("::")[1], describe(values)))
        return func(*args, **kwargs)


def flop_counts(fn) -> dict[str, int]:
    """torch.utils.flop_counter's FLOPs per op name ("aten::mm") for one run of ``fn``."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return {"aten::" + str(op).split(".", 1)[1]: n for op, n in counter.get_flop_counts().get("Global", {}).items()}


def our_counts(fn, names) -> dict[str, float]:
    """Our FLOPs per op name over the calls of ``fn`` that flop_counter also counts."""
    recorder = Recorder()
    with recorder:
        fn()
    totals: dict[str, float] = {}
    for name, described in recorder.calls:
        if name in names:
            cost = op_cost(name, *described)
            assert cost is not None, f"{name} {described} has no cost"
            totals[name] = totals.get(name, 0) + cost.flops
    return totals


def flops(name, *values) -> float:
    cost = op_cost(name, *describe(values))
    assert cost is not None, f"{name} has no cost"
    return cost.flops


# -- GEMMs ---------------------------------------------------------------------------------

size = st.integers(1, 24)
dtypes = st.sampled_from([torch.float32, torch.bfloat16, torch.float64])


@SETTINGS
@given(m=size, n=size, k=size, batch=st.integers(1, 4), dtype=dtypes, bias_kind=st.sampled_from(["n", "mn", "1n"]))
def test_gemm_ops_match_flop_counter(m, n, k, batch, dtype, bias_kind):
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    bias = torch.randn({"n": (n,), "mn": (m, n), "1n": (1, n)}[bias_kind], dtype=dtype)
    ba, bb = torch.randn(batch, m, k, dtype=dtype), torch.randn(batch, k, n, dtype=dtype)
    bself = torch.randn(batch, m, n, dtype=dtype)
    cases = {
        "aten::mm": (lambda: torch.mm(a, b), (a, b)),
        "aten::addmm": (lambda: torch.addmm(bias, a, b), (bias, a, b, 1, 1)),
        "aten::bmm": (lambda: torch.bmm(ba, bb), (ba, bb)),
        "aten::baddbmm": (lambda: torch.baddbmm(bself, ba, bb), (bself, ba, bb, 1, 1)),
    }
    for name, (fn, values) in cases.items():
        expected = flop_counts(fn)[name]
        batches = batch if name in ("aten::bmm", "aten::baddbmm") else 1
        assert flops(name, *values) == expected == 2 * batches * m * n * k


@SETTINGS
@given(m=size, n=size, k=size, lead=st.lists(st.integers(1, 3), max_size=2), with_bias=st.booleans(),
       dtype=dtypes)
def test_linear_matches_flop_counter(m, n, k, lead, with_bias, dtype):
    x = torch.randn(*lead, m, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype)
    b = torch.randn(n, dtype=dtype) if with_bias else None
    expected = sum(flop_counts(lambda: F.linear(x, w, b)).values())
    assert flops("aten::linear", x, w, b) == expected


@SETTINGS
@given(m=size, n=size, k=size, a_batch=st.lists(st.integers(1, 3), max_size=2),
       b_batch=st.lists(st.integers(1, 3), max_size=2))
def test_matmul_with_batch_dims_matches_flop_counter(m, n, k, a_batch, b_batch):
    # broadcasting needs each trailing pair to agree or be 1
    a_batch = [1 if i % 2 else d for i, d in enumerate(a_batch)]
    a, b = torch.randn(*a_batch, m, k), torch.randn(*b_batch, k, n)
    try:
        torch.broadcast_shapes(tuple(a_batch), tuple(b_batch))
    except RuntimeError:
        assume(False)
    expected = sum(flop_counts(lambda: torch.matmul(a, b)).values())
    assert flops("aten::matmul", a, b) == expected


def test_matmul_with_vectors_counts_what_flop_counter_does_not():
    # flop_counter has no formula for mv or dot; the rank-1 cases are costed by hand.
    assert flops("aten::matmul", torch.randn(7), torch.randn(7)) == 2 * 7
    assert flops("aten::matmul", torch.randn(3, 5, 7), torch.randn(7)) == 2 * 15 * 7
    assert flops("aten::matmul", torch.randn(7), torch.randn(2, 7, 4)) == 2 * 2 * 7 * 4
    assert flops("aten::mv", torch.randn(5, 7), torch.randn(7)) == 2 * 5 * 7


@SETTINGS
@given(m=size, n=size, k=size, batch=st.integers(1, 3), a_grad=st.booleans())
def test_gemm_backward_matches_flop_counter(m, n, k, batch, a_grad):
    def run():
        a = torch.randn(batch, m, k, requires_grad=a_grad)
        w = torch.randn(k, n, requires_grad=True)
        x = torch.randn(m, k, requires_grad=True)
        bias = torch.randn(n, requires_grad=True)
        (torch.matmul(a, w).sum() + F.linear(x, w.t(), bias).sum()).backward()

    expected = flop_counts(run)
    assert our_counts(run, expected) == expected


# -- convolutions --------------------------------------------------------------------------


@st.composite
def conv_setups(draw, transposed=False):
    nd = draw(st.sampled_from([1, 2, 2, 3]))
    groups = draw(st.integers(1, 3))
    c_in = groups * draw(st.integers(1, 3))
    c_out = groups * draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(nd))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    spatial = tuple(draw(st.integers(1, 7 if nd < 3 else 4)) for _ in range(nd))
    n = draw(st.integers(1, 2))
    if transposed:
        output_padding = tuple(draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation))
        for i, s, p, d, k, op in zip(spatial, stride, padding, dilation, kernel, output_padding):
            assume((i - 1) * s - 2 * p + d * (k - 1) + op + 1 >= 1)
        x = torch.randn(n, c_in, *spatial)
        w = torch.randn(c_in, c_out // groups, *kernel)
        return x, w, stride, padding, dilation, groups, output_padding
    for i, p, d, k in zip(spatial, padding, dilation, kernel):
        assume(i + 2 * p >= d * (k - 1) + 1)
    x = torch.randn(n, c_in, *spatial)
    w = torch.randn(c_out, c_in // groups, *kernel)
    return x, w, stride, padding, dilation, groups, None


CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@SETTINGS
@given(setup=conv_setups(), with_bias=st.booleans())
def test_conv_forward_matches_flop_counter(setup, with_bias):
    x, w, stride, padding, dilation, groups, _ = setup
    nd = x.dim() - 2
    bias = torch.randn(w.shape[0]) if with_bias else None
    run = lambda: CONV[nd](x, w, bias, stride, padding, dilation, groups)
    expected = flop_counts(run)["aten::convolution"]
    name = f"aten::conv{nd}d"
    cost = op_cost(name, *describe((x, w, bias, list(stride), list(padding), list(dilation), groups)))
    assert cost.flops == expected
    out = run()
    assert cost.out_spatial == tuple(out.shape[2:]) and cost.groups == groups and cost.c_out == w.shape[0]
    assert cost.bytes_written == out.numel() * 4
    # the ops conv{nd}d dispatches to read the same recorded arguments
    assert our_counts(run, {"aten::convolution"}) == {"aten::convolution": expected}


@SETTINGS
@given(setup=conv_setups(transposed=True))
def test_transposed_conv_matches_flop_counter(setup):
    x, w, stride, padding, dilation, groups, output_padding = setup
    nd = x.dim() - 2
    run = lambda: CONV_T[nd](x, w, None, stride, padding, output_padding, groups, dilation)
    expected = flop_counts(run)["aten::convolution"]
    cost = op_cost(f"aten::conv_transpose{nd}d",
                   *describe((x, w, None, list(stride), list(padding), list(output_padding), groups, list(dilation))))
    assert cost.flops == expected
    assert cost.out_spatial == tuple(run().shape[2:])


@SETTINGS
@given(setup=conv_setups(), input_grad=st.booleans(), with_bias=st.booleans(), transposed=st.booleans())
def test_conv_backward_matches_flop_counter(setup, input_grad, with_bias, transposed):
    x, w, stride, padding, dilation, groups, _ = setup
    nd = x.dim() - 2
    if transposed:
        w = torch.randn(x.shape[1], w.shape[0] // groups, *w.shape[2:])
        for i, s, p, d, k in zip(x.shape[2:], stride, padding, dilation, w.shape[2:]):
            assume((i - 1) * s - 2 * p + d * (k - 1) + 1 >= 1)

    def run():
        xi = x.clone().requires_grad_(input_grad)
        wi = w.clone().requires_grad_(True)
        bias = torch.zeros(w.shape[1] * groups if transposed else w.shape[0], requires_grad=True) if with_bias else None
        if transposed:
            out = CONV_T[nd](xi, wi, bias, stride, padding, 0, groups, dilation)
        else:
            out = CONV[nd](xi, wi, bias, stride, padding, dilation, groups)
        out.sum().backward()

    expected = flop_counts(run)
    ours = our_counts(run, expected)
    forward = expected["aten::convolution"]
    assert ours["aten::convolution"] == forward
    # flop_counter counts a grouped convolution's weight gradient `groups` times over;
    # ours counts it once, as computed
    assert ours["aten::convolution_backward"] == expected["aten::convolution_backward"] - (groups - 1) * forward
    per_grad = forward
    assert ours["aten::convolution_backward"] == per_grad * (1 + input_grad)


def test_conv_backward_honours_output_mask_and_groups_from_channels():
    grad, x, w = torch.randn(2, 4, 3, 3), torch.randn(2, 6, 5, 5), torch.randn(4, 3, 3, 3)  # groups 2
    values = [grad, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 2]
    per_grad = 2 * 2 * 9 * 4 * 3 * 9
    assert flops("aten::convolution_backward", *values, [True, True, False]) == 2 * per_grad
    assert flops("aten::convolution_backward", *values, [False, True, True]) == per_grad
    weight_only = op_cost("aten::convolution_backward", *describe(values + [[False, True, False]]))
    assert weight_only.bytes_read == (grad.numel() + x.numel()) * 4 and weight_only.bytes_written == w.numel() * 4
    # without Concrete Inputs (an older trace) groups come from the channels; the mask is
    # not known, so both gradients are counted and the model says so
    dims, types, strides, _ = describe(values + [[False, True, False]])
    cost = op_cost("aten::convolution_backward", dims, types, strides)
    assert cost.flops == 2 * per_grad and cost.groups == 2 and "output_mask not recorded" in cost.model


def test_conv_without_stride_and_padding_leaves_flops_unknown():
    # a 2021 trace: the lists are GenericList with no values
    dims = [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []]
    types = ["float", "float", "GenericList", "GenericList", "GenericList", "Int", "Bool", "Bool", "Bool"]
    cost = op_cost("aten::cudnn_convolution", dims, types)
    assert math.isnan(cost.flops) and math.isnan(cost.bytes_written)
    assert cost.bytes_read == (32 * 3 * 224 * 224 + 64 * 3 * 49) * 4
    assert (cost.c_in, cost.c_out, cost.kernel, cost.groups, cost.dtype) == (3, 64, (7, 7), 1, "tf32-eligible")
    assert "stride/padding/dilation not recorded" in cost.model


def test_conv_output_size_from_the_backward_of_the_same_convolution():
    forward = {"name": "aten::cudnn_convolution", "input_dims": json.dumps([[32, 3, 224, 224], [64, 3, 7, 7]]),
               "input_types": json.dumps(["float", "float", "GenericList", "GenericList", "GenericList", "Int"])}
    backward = {"name": "aten::cudnn_convolution_backward",
                "input_dims": json.dumps([[32, 3, 224, 224], [32, 64, 112, 112], [64, 3, 7, 7], [], [], [], [], [],
                                          [], [], []]),
                "input_types": json.dumps(["float", "float", "float", "GenericList", "GenericList", "GenericList",
                                           "Int", "Bool", "Bool", "Bool", "GenericList"])}
    costs = costs_for_ops(pd.DataFrame([forward, backward]))
    assert costs["flops"].iloc[0] == 2 * 32 * 112 * 112 * 64 * 3 * 49
    assert costs["out_spatial"].iloc[0] == "112x112"
    assert costs["bytes_written"].iloc[0] == 32 * 64 * 112 * 112 * 4


# -- attention -----------------------------------------------------------------------------


@st.composite
def attention_shapes(draw):
    b, h_kv = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h_q = h_kv * draw(st.integers(1, 2))
    s_q, s_k = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    d, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    return b, h_q, h_kv, s_q, s_k, d, d_v


@SETTINGS
@given(shapes=attention_shapes(), causal=st.booleans())
def test_sdpa_matches_flop_counter_and_its_kernels(shapes, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h_q, h_kv, s_q, s_k, d, d_v = shapes
    q, k, v = torch.randn(b, h_q, s_q, d), torch.randn(b, h_kv, s_k, d), torch.randn(b, h_kv, s_k, d_v)
    gqa = h_q != h_kv
    with sdpa_kernel(SDPBackend.MATH):  # on CPU the math path is the one flop_counter sees (as bmm)
        expected = sum(flop_counts(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)).values())
    assert expected == 2 * b * h_q * s_q * s_k * (d + d_v)
    assert flops("aten::scaled_dot_product_attention", q, k, v, None, 0.0, causal, None, gqa) == expected
    # the fused kernels flop_counter has formulas for, on meta tensors (shapes only)
    if gqa or d != d_v:
        return
    qm, km, vm = (t.to("meta") for t in (q, k, v))
    kernels = {
        "aten::_scaled_dot_product_flash_attention": (qm, km, vm, 0.0, causal, False, None),
        "aten::_scaled_dot_product_efficient_attention": (qm, km, vm, None, True, 0.0, causal, None),
        "aten::_scaled_dot_product_cudnn_attention": (qm, km, vm, None, True, 0.0, causal, False, None),
    }
    for name, values in kernels.items():
        op = getattr(torch.ops.aten, name.removeprefix("aten::"))
        counted = flop_counts(lambda op=op, values=values: op(*values[:-1], scale=values[-1]))[name]  # scale: kw-only
        assert flops(name, *values) == counted == expected


@SETTINGS
@given(shapes=attention_shapes())
def test_sdpa_backward_kernels_match_flop_counter(shapes):
    b, h_q, _, s_q, s_k, d, d_v = shapes
    q, k = torch.empty(b, h_q, s_q, d, device="meta"), torch.empty(b, h_q, s_k, d, device="meta")
    v = torch.empty(b, h_q, s_k, d_v, device="meta")
    e_out, e_lse, e_seed, e_off = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
    kernels = {"aten::_scaled_dot_product_efficient_attention_backward":
               (e_out, q, k, v, None, e_out, e_lse, e_seed, e_off, 0.0, [True, True, True, False], False, None)}
    if d == d_v:  # the flash kernel needs one head dim
        out, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
        kernels["aten::_scaled_dot_product_flash_attention_backward"] = (
            out, q, k, v, out, lse, cq, ck, mq, mk, 0.0, False, seed, offset, None)
    for name, values in kernels.items():
        op = getattr(torch.ops.aten, name.removeprefix("aten::"))
        counted = flop_counts(lambda op=op, values=values: op(*values[:-1], scale=values[-1]))[name]  # scale: kw-only
        assert flops(name, *values) == counted == 2 * b * h_q * s_q * s_k * (3 * d + 2 * d_v)


def test_flash_kernel_reads_its_batch_seq_heads_layout():
    # _flash_attention_forward takes (batch, seq, heads, dim); its work is sdpa's on the
    # (batch, heads, seq, dim) view. (flop_counter reads these dims as heads-first.)
    b, s, h, d = 2, 6, 4, 8
    q = torch.empty(b, s, h, d, device="meta")
    expected = flop_counts(lambda: torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2)))["aten::_scaled_dot_product_flash_attention"]
    cost = op_cost("aten::_flash_attention_forward", *describe((q, q, q, None, None, s, s, 0.0, True, False)))
    assert cost.flops == expected and (cost.m, cost.n, cost.k, cost.batch) == (s, s, d, b * h)
    assert "causal" in cost.model
    # packed variable-length input: no per-sequence lengths, so no FLOPs
    packed = op_cost("aten::_flash_attention_forward", [[20, 4, 8]] * 3 + [[3], [3]], ["c10::Half"] * 3 + ["int"] * 2)
    assert math.isnan(packed.flops) and packed.bytes_read == 3 * 20 * 4 * 8 * 2


# -- what torch.profiler records, through advisor.importers.load ---------------------------


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
        self.norm = torch.nn.BatchNorm2d(6)
        self.proj = torch.nn.Linear(6, 8)
        self.bf16 = torch.nn.Linear(8, 8).to(torch.bfloat16)

    def forward(self, x, a, b, c):
        y = F.relu(self.norm(self.conv(x)))  # [2, 6, 4, 4]
        t = self.proj(y.flatten(2).transpose(1, 2))  # [2, 16, 8]
        t = t + self.bf16(t.to(torch.bfloat16)).float()
        q = t.view(2, 16, 2, 4).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, q, q)
        return att.sum() + torch.baddbmm(c, a, b).sum() + torch.matmul(a, b[0]).sum() + torch.mm(a[0], b[0]).sum()


def _step(model):
    torch.manual_seed(0)
    # the input wants a gradient too: without Concrete Inputs (which the session does not
    # keep) convolution_backward's output_mask is unknown and both gradients are counted
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    a, b, c = torch.randn(3, 5, 7), torch.randn(3, 7, 4), torch.randn(3, 5, 4)
    model(x, a, b, c).backward()


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One CPU training step of Block under torch.profiler and under flop_counter."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from advisor.importers import load

    torch.manual_seed(0)
    model = Block()
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    with sdpa_kernel(SDPBackend.MATH):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            _step(model)
        prof.export_chrome_trace(str(path))
        counts = flop_counts(lambda: _step(model))
    session = load(path)
    ops = session.events[session.events["kind"] == "op"]
    raw = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "cpu_op"]
    return ops, costs_for_ops(ops), counts, raw


def test_costs_of_profiled_rows_equal_flop_counter(profiled):
    ops, costs, counts, _ = profiled
    assert set(costs.columns) == set(COST_COLUMNS) and costs.index.equals(ops.index)
    matrix = costs["counted"] & costs["kind"].isin(["gemm", "conv", "attention"])
    # the grouped convolution's weight gradient: flop_counter counts it `groups` times
    conv_forward = counts["aten::convolution"]
    expected = sum(counts.values()) - (2 - 1) * conv_forward
    assert costs.loc[matrix, "flops"].sum() == expected
    # the forward convolution's output size came from its backward (no Concrete Inputs in
    # the session), and each nesting level carries the same cost but counts once
    conv_rows = costs[ops["name"].isin(["aten::conv2d", "aten::convolution", "aten::_convolution"])]
    assert (conv_rows["flops"] == conv_forward).all() and conv_rows["counted"].sum() == 1
    bf16 = costs[(ops["name"] == "aten::linear") & (costs["dtype"] == "bf16")]
    assert len(bf16) == 1 and bf16["flops"].iloc[0] == 2 * 32 * 8 * 8


def test_describe_matches_the_profiler(profiled):
    # The spelling this file's tests give op_cost is the profiler's own.
    _, _, _, raw = profiled
    recorder = Recorder()
    torch.manual_seed(0)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with recorder, sdpa_kernel(SDPBackend.MATH):
        _step(Block())
    def parsed(concrete):
        return json.dumps([ast.literal_eval(c) if c else c for c in concrete])

    recorded = {(name, json.dumps(dims), json.dumps(types), json.dumps(strides), parsed(concrete))
                for name, (dims, types, strides, concrete) in recorder.calls}
    checked = [e for e in raw if e["name"] in ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm",
                                               "aten::convolution_backward", "aten::native_batch_norm")]
    assert len(checked) >= 10
    for event in checked:
        args = event["args"]
        key = (event["name"], json.dumps(args["Input Dims"]), json.dumps(args["Input type"]),
               json.dumps(args["Input Strides"]), parsed(args["Concrete Inputs"]))
        assert key in recorded


def test_concrete_inputs_as_the_profiler_writes_them(profiled):
    # The session does not (yet) keep "Concrete Inputs"; given them, a forward convolution
    # needs no backward to know its output size.
    _, _, counts, raw = profiled
    conv = next(e["args"] for e in raw if e["name"] == "aten::conv2d")
    cost = op_cost("aten::conv2d", conv["Input Dims"], conv["Input type"], conv["Input Strides"],
                   conv["Concrete Inputs"])
    assert cost.flops == counts["aten::convolution"] and cost.out_spatial == (4, 4) and cost.groups == 2
    norm = next(e["args"] for e in raw if e["name"] == "aten::native_batch_norm")
    cost = op_cost("aten::native_batch_norm", norm["Input Dims"], norm["Input type"], norm["Input Strides"],
                   norm["Concrete Inputs"])
    assert "training" in cost.model and "not recorded" not in cost.model


def test_every_costed_profiled_row_matches_op_cost(profiled):
    ops, costs, _, _ = profiled
    for row, cost_row in zip(ops.itertuples(), costs.itertuples()):
        cost = op_cost(row.name, row.input_dims, row.input_types, row.input_strides)
        if cost is None:
            assert math.isnan(cost_row.flops) and cost_row.kind == ""
        elif not math.isnan(cost.flops):
            assert cost_row.flops == cost.flops and cost_row.kind == cost.kind


class Layers(torch.nn.Module):
    """Embedding, norms, softmax, activations, reductions: the ops flop_counter leaves out."""

    def __init__(self):
        super().__init__()
        self.emb, self.ln, self.rms = torch.nn.Embedding(50, 8), torch.nn.LayerNorm(8), torch.nn.RMSNorm(8)
        self.gn, self.bn, self.lin = torch.nn.GroupNorm(2, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(8, 8)

    def forward(self, idx, img):
        h = F.gelu(self.lin(self.rms(self.ln(self.emb(idx)))))
        h = F.softmax(h, -1).cumsum(-1) + F.log_softmax(h, -1)
        g = self.bn(self.gn(img).flatten(2)).sigmoid() * torch.tanh(img.flatten(2))
        return h.mean() + g.amax() + F.silu(h).var()


def test_profiled_layers_are_costed_from_the_profilers_spelling(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = Layers()
    optimizer = torch.optim.Adam(model.parameters(), foreach=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model(torch.randint(0, 50, (2, 5)), torch.randn(2, 4, 3, 3)).backward()
        optimizer.step()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e.get("cat") == "cpu_op"]
    costs = {}
    for event in events:
        a = event["args"]
        if event["name"] in costed_names():
            cost = op_cost(event["name"], a["Input Dims"], a["Input type"], a["Input Strides"], a["Concrete Inputs"])
            # training dropout is left to the ops it calls; everything else fits its model
            assert cost is not None or event["name"] == "aten::dropout", event["name"]
            costs.setdefault(event["name"], cost)
    assert costs["aten::layer_norm"].flops == 8 * 80 and costs["aten::layer_norm"].bytes_written == 4 * (80 + 2 * 10)
    assert costs["aten::native_group_norm"].bytes_written == 4 * (72 + 2 * 2 * 2)  # output, mean and rstd of 2x2
    assert costs["aten::embedding_dense_backward"].bytes_written == 50 * 8 * 4
    assert costs["aten::mean"].bytes_written == 10 * 4  # RMS norm's mean over the last dim, kept
    assert costs["aten::native_batch_norm"].model.startswith("batch norm (training)")
    # the input of group norm wants no gradient: its output_mask says so
    assert "grad input" not in costs["aten::native_group_norm_backward"].model
    assert costs["aten::_foreach_addcmul_"].flops == 3 * sum(p.numel() for p in model.parameters())
    for name in ("aten::_softmax_backward_data", "aten::_log_softmax_backward_data", "aten::gelu_backward",
                 "aten::silu_backward", "aten::native_layer_norm_backward", "aten::native_batch_norm_backward"):
        assert costs[name].complete and costs[name].flops > 0, name


shapes = st.lists(st.integers(1, 4), min_size=0, max_size=4)


@SETTINGS
@given(a=shapes, b=shapes, op=st.sampled_from(["add", "mul", "maximum", "lt", "where"]))
def test_elementwise_output_is_torchs(a, b, op):
    x, y = torch.randn(a), torch.randn(b)
    try:
        expected = torch.broadcast_shapes(x.shape, y.shape)
    except RuntimeError:
        assume(False)
    if op == "where":
        out = torch.where(x > 0, x, y)
        cost = op_cost("aten::where", *describe((x > 0, x, y)))
    else:
        out = getattr(torch, op)(x, y)
        cost = op_cost(f"aten::{op}", *describe((x, y, 1) if op == "add" else (x, y)))
    assert out.shape == expected
    assert cost.flops == out.numel() and cost.bytes_written == out.numel() * out.element_size()
    reads = (x.numel() + y.numel()) * 4 + (x.numel() if op == "where" else 0)
    assert cost.bytes_read == reads


@SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data(), keepdim=st.booleans(),
       op=st.sampled_from(["sum", "mean", "amax", "prod"]))
def test_reduction_output_is_torchs(shape, data, keepdim, op):
    x = torch.randn(shape)
    dims = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                              unique_by=lambda d: d % len(shape)))
    if op == "prod":
        dims = dims[:1]
        out = torch.prod(x, dims[0], keepdim)
        cost = op_cost("aten::prod", *describe((x, dims[0], keepdim, None)))
    else:
        out = getattr(torch, op)(x, dims, keepdim)
        cost = op_cost(f"aten::{op}", *describe((x, dims, keepdim) + ((None,) if op != "amax" else ())))
    assert cost.bytes_written == out.numel() * 4 and cost.flops == x.numel()


# -- bytes, by hand ------------------------------------------------------------------------


def test_gemm_bytes():
    a, b = torch.randn(64, 32, dtype=torch.float16), torch.randn(32, 16, dtype=torch.float16)
    cost = op_cost("aten::mm", *describe((a, b)))
    assert (cost.bytes_read, cost.bytes_written, cost.dtype, cost.kind) == (2 * (64 * 32 + 32 * 16), 2 * 64 * 16,
                                                                            "fp16", "gemm")
    bias = torch.randn(1, 16).expand(64, 16)  # stride 0: 16 distinct elements
    cost = op_cost("aten::addmm", *describe((bias, a.float(), b.float().t().contiguous().t(), 1, 1)))
    assert cost.bytes_read == 4 * (16 + 64 * 32 + 32 * 16) and cost.dtype == "tf32-eligible"


def test_elementwise_bytes_and_flops():
    x, y = torch.randn(4, 1, 8), torch.randn(1, 5, 8)
    cost = op_cost("aten::add", *describe((x, y, 1)))
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (160, 4 * (32 + 40), 4 * 160)
    assert op_cost("aten::add", *describe((x, y, 2))).flops == 320  # alpha != 1 multiplies too
    expanded = torch.randn(1, 8).expand(4, 8)
    cost = op_cost("aten::mul", *describe((expanded, torch.randn(4, 8))))
    assert cost.bytes_read == 4 * (8 + 32)
    inplace = op_cost("aten::add_", *describe((torch.randn(4, 8), torch.randn(8), 1)))
    assert (inplace.bytes_read, inplace.bytes_written) == (4 * 40, 4 * 32)
    half = torch.randn(10, dtype=torch.float16)
    assert op_cost("aten::silu", *describe((half,))).flops == 5 * 10
    compare = op_cost("aten::lt", *describe((half, torch.randn(10, dtype=torch.float16))))
    assert compare.bytes_written == 10 and compare.dtype == "fp16"
    out_variant = op_cost("aten::clamp_min", *describe((torch.randn(3, 4), 0, torch.empty(3, 4))))
    assert (out_variant.bytes_read, out_variant.bytes_written) == (48, 48)
    ints = op_cost("aten::div", *describe((torch.ones(6, dtype=torch.int64), torch.ones(6, dtype=torch.int64))))
    assert ints.bytes_written == 6 * 4 and ints.dtype == "fp32"
    grad = op_cost("aten::threshold_backward", *describe((torch.randn(5), torch.randn(5), 0)))
    assert (grad.flops, grad.bytes_read, grad.bytes_written) == (5, 40, 20)


def test_copy_embedding_norm_and_reduction_bytes():
    cost = op_cost("aten::copy_", *describe((torch.empty(10, dtype=torch.float16), torch.randn(10), False)))
    assert (cost.bytes_read, cost.bytes_written, cost.kind) == (40, 20, "copy")
    table, idx = torch.randn(1000, 64), torch.tensor([[1, 2, 3], [4, 5, 6]])
    cost = op_cost("aten::embedding", *describe((table, idx, -1, False, False)))
    assert (cost.bytes_read, cost.bytes_written, cost.kind) == (6 * 64 * 4 + 6 * 8, 6 * 64 * 4, "embedding")
    x, w, b = torch.randn(4, 10), torch.randn(10), torch.randn(10)
    cost = op_cost("aten::native_layer_norm", *describe((x, [10], w, b, 1e-5)))
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (8 * 40, 4 * 60, 4 * 40 + 2 * 4 * 4)
    x = torch.randn(3, 4, 5)
    cost = op_cost("aten::sum", *describe((x, [1], True, None)))
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (60, 240, 15 * 4)
    assert op_cost("aten::sum", *describe((x, None))).bytes_written == 4
    dims, types, strides, _ = describe((x, [1], True, None))
    unknown = op_cost("aten::sum", dims, types, strides)  # dims not recorded
    assert unknown.flops == 60 and math.isnan(unknown.bytes_written)
    assert op_cost("aten::_softmax", *describe((x, -1, False))).bytes_written == 240


def test_conv_and_attention_bytes():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(4, 2, 3, 3)
    cost = op_cost("aten::convolution", *describe((x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)))
    assert (cost.bytes_read, cost.bytes_written, cost.out_spatial) == (4 * (50 + 72), 4 * 36, (3, 3))
    q = torch.randn(1, 2, 4, 8, dtype=torch.float16)
    cost = op_cost("aten::scaled_dot_product_attention", *describe((q, q, q, None, 0.0, False, None, False)))
    assert (cost.bytes_read, cost.bytes_written, cost.dtype) == (3 * 2 * 64, 2 * 64, "fp16")


def test_views_contiguous_and_lists():
    x = torch.randn(4, 6)
    assert op_cost("aten::transpose", *describe((x, 0, 1))).bytes == 0
    copy = op_cost("aten::contiguous", *describe((x.t(), torch.contiguous_format)))
    assert (copy.bytes_read, copy.bytes_written, copy.kind) == (96, 96, "copy")
    same = op_cost("aten::contiguous", *describe((x, torch.contiguous_format)))
    assert (same.bytes, same.kind) == (0, "view")
    # without strides, whether it copies is unknown: the clone it calls carries the cost
    assert op_cost("aten::contiguous", [[4, 6], []], ["float", "Scalar"]) is None
    listed = op_cost("aten::cat", *describe(([torch.randn(2, 3), torch.randn(4, 3)], 0)))
    assert listed.flops == 0 and math.isnan(listed.bytes_read) and "dtype is not recorded" in listed.model


def test_unknown_and_misfit_ops_have_no_cost():
    assert op_cost("aten::my_custom_op", [[3, 4]], ["float"]) is None
    assert op_cost("ConvolutionBackward0", [[2, 4, 5, 5]], ["float"]) is None
    assert op_cost("aten::to", [[3]], ["float", "Scalar"]) is None
    assert op_cost("aten::mm", [[3, 4], [5, 6]], ["float", "float"]) is None  # k differs
    assert op_cost("aten::mm", [[3, 4]], ["float"]) is None
    assert op_cost("aten::mm", "not json", "[]") is None
    assert op_cost("aten::mm", "", "") is None
    assert op_cost("aten::bmm", [[2, 3, 4], [3, 4, 5]], ["float", "float"]) is None  # batch differs
    assert op_cost("aten::linear", [[3, 4], [5, 6]], ["float", "float"]) is None
    assert op_cost("aten::mm", [[3, 4], [4, 5]], ["float", "c10::Half"]) is None  # mixed dtypes
    assert op_cost("aten::add", [[3, 4], [5]], ["float", "float", "Scalar"]) is None  # no broadcast
    assert "aten::mm" in costed_names() and "aten::to" not in costed_names()


# -- tables --------------------------------------------------------------------------------


def test_costs_for_ops_costs_each_distinct_call_once(monkeypatch):
    from advisor.knowledge.costs import _registry

    calls = []
    real = _registry.MODELS["aten::mm"]
    monkeypatch.setitem(_registry.MODELS, "aten::mm", lambda name, args: calls.append(name) or real(name, args))
    rows = [("aten::mm", "[[3,4],[4,5]]", '["float","float"]')] * 500 + \
           [("aten::mm", "[[6,4],[4,5]]", '["float","float"]')] * 300 + [("aten::relu", "[[7]]", '["float"]')] * 200
    frame = pd.DataFrame(rows, columns=["name", "input_dims", "input_types"], index=np.arange(1000) * 3)
    frame = frame.astype("category")
    costs = costs_for_ops(frame)
    assert len(calls) == 2
    assert costs.index.equals(frame.index)
    assert costs["flops"].tolist() == [120.0] * 500 + [240.0] * 300 + [7.0] * 200
    assert costs["m"].tolist() == [3] * 500 + [6] * 300 + [pd.NA] * 200


def test_counted_rows_sum_each_flop_once():
    frame = pd.DataFrame({
        "id": [0, 1, 2, 3, 4, 5],
        "parent_op": [-1, 0, 0, -1, -1, 4],
        "name": ["aten::linear", "aten::t", "aten::addmm", "aten::mm", "aten::conv2d", "aten::convolution"],
        "input_dims": ["[[8,4],[5,4],[5]]", "[[5,4]]", "[[5],[8,4],[4,5],[],[]]", "[[2,3],[3,4]]",
                       "[[1,2,5,5],[3,2,3,3],[],[],[],[],[]]", "[[1,2,5,5],[3,2,3,3],[],[],[],[],[],[],[]]"],
        "input_types": ['["float","float","float"]', '["float"]', '["float","float","float","Scalar","Scalar"]',
                        '["float","float"]',
                        '["float","float","","ScalarList","","ScalarList","Scalar"]',
                        '["float","float","","ScalarList","ScalarList","ScalarList","Scalar","ScalarList","Scalar"]'],
        "concrete_inputs": ["", "", "", "", '["","","","[1, 1]","","[1, 1]","1"]',
                            '["","","","[1, 1]","[0, 0]","[1, 1]","False","[0, 0]","1"]'],
    })
    costs = costs_for_ops(frame)
    # conv2d's padding is a string the profiler does not record: its child counts instead
    assert costs["counted"].tolist() == [True, False, False, True, False, True]
    assert costs.loc[costs["counted"], "flops"].sum() == 2 * 8 * 5 * 4 + 2 * 2 * 3 * 4 + 2 * 9 * 3 * 2 * 9


def test_under_autocast_the_inner_call_in_the_cast_dtype_is_the_one_counted():
    """torch.autocast records aten::linear on the fp32 inputs, casts them (aten::to), and
    calls aten::linear again on bf16: the math runs in bf16, so the inner call counts and
    the casts are work of their own."""
    frame = pd.DataFrame({
        "id": [0, 1, 2, 3],
        "parent_op": [-1, 0, 0, 0],
        "name": ["aten::linear", "aten::_to_copy", "aten::_to_copy", "aten::linear"],
        "input_dims": ["[[128,512],[1024,512],[1024]]", "[[128,512],[],[],[],[],[],[]]",
                       "[[1024,512],[],[],[],[],[],[]]", "[[128,512],[1024,512],[1024]]"],
        "input_types": ['["float","float","float"]', '["float","ScalarType","","","","",""]',
                        '["float","ScalarType","","","","",""]',
                        '["c10::BFloat16","c10::BFloat16","c10::BFloat16"]'],
    })
    costs = costs_for_ops(frame)
    assert costs.loc[3, "dtype"] == "bf16" and bool(costs.loc[3, "counted"])
    assert not bool(costs.loc[0, "counted"]), "the outer call on fp32 inputs does not compute in fp32"
    assert costs.loc[costs["counted"] & (costs["kind"] == "gemm"), "flops"].sum() == 2 * 128 * 1024 * 512
    # Without autocast (same dtype inside), the outer call still counts for its children.
    plain = frame.assign(input_types=['["float","float","float"]'] * 4)
    assert costs_for_ops(plain)["counted"].tolist()[0] is True


def test_kernel_costs_tie_kernels_to_the_op_that_launched_them():
    events = pd.DataFrame({
        "id": [0, 1, 2, 3, 4, 5, 6],
        "kind": ["op", "op", "kernel", "op", "kernel", "kernel", "kernel"],
        "parent_op": [-1, 0, 1, -1, 3, 3, -1],
        "name": ["aten::linear", "aten::addmm", "gemm", "aten::mm", "gemm_a", "gemm_b", "orphan"],
        "input_dims": ["[[8,4],[5,4],[5]]", "[[5],[8,4],[4,5],[],[]]", "", "[[2,3],[3,4]]", "", "", ""],
        "input_types": ['["float","float","float"]', '["float","float","float","Scalar","Scalar"]', "",
                        '["float","float"]', "", "", ""],
    })
    kernels = kernel_costs(events)
    assert kernels.index.tolist() == [2, 4, 5, 6]
    assert kernels["op"].tolist() == [1, 3, 3, -1] and kernels["op_kernels"].tolist() == [1, 2, 2, 0]
    assert kernels["flops"].iloc[0] == 2 * 8 * 5 * 4 and kernels["kind"].iloc[0] == "gemm"
    assert kernels["flops"].iloc[1:].isna().all()
    # Each kernel's op's kind and dtype, row by row (the untied kernel has none).
    assert kernels["kind"].tolist() == ["gemm", "gemm", "gemm", ""]
    assert kernels["dtype"].tolist() == ["tf32-eligible", "tf32-eligible", "tf32-eligible", ""]
    # The op rows apart from the kernels (a Session's frames of one kind) give the same.
    apart = kernel_costs(events[events["kind"] == "kernel"], ops=events[events["kind"] == "op"])
    pd.testing.assert_frame_equal(apart, kernels)
    # Looked up per distinct call (the kernel table's way) or from the costs of every op row.
    ops = events[events["kind"] == "op"]
    pd.testing.assert_frame_equal(kernel_costs(events, ops=ops, groups=cost_groups(ops)), kernels)
    pd.testing.assert_frame_equal(kernel_costs(events, costs_for_ops(ops)), kernels)


@pytest.mark.parametrize("seed", range(5))
def test_cost_groups_number_the_distinct_calls_in_the_order_they_first_come(seed):
    """The specification: a groupby over the key columns, numbered by first appearance."""
    rng = np.random.default_rng(seed)
    n = 400
    frame = pd.DataFrame({
        "name": rng.choice(["aten::mm", "aten::addmm", "aten::relu", "aten::conv2d"], n),
        "input_dims": rng.choice(["[[2,3],[3,4]]", "[[8,4],[4,5]]", "", "[[1]]"], n),
        "input_types": pd.Categorical(rng.choice(['["float","float"]', '["c10::Half"]', None], n)),
        "concrete_inputs": rng.choice(["", '["", "1"]'], n),
    })
    as_text = frame.astype(object).where(frame.notna(), "(absent)")
    expected = as_text.groupby(list(frame.columns), sort=False).ngroup().to_numpy()
    assert cost_groups(frame).group_ids.tolist() == expected.tolist()


def test_kernel_costs_by_group_take_each_kernels_own_ops_group():
    """Ops that are the same call share a group, so an op's group is not its position: the
    kernels of the third op (the second group) get its cost, looked up either way."""
    mm_small = ("aten::mm", "[[2,3],[3,4]]", '["float","float"]')
    mm_large = ("aten::mm", "[[8,4],[4,5]]", '["float","float"]')
    rows = [(0, "op", -1, *mm_small), (1, "op", -1, *mm_small), (2, "op", -1, *mm_large),
            (3, "kernel", 0, "gemm_small", "", ""), (4, "kernel", 2, "gemm_large", "", "")]
    events = pd.DataFrame(rows, columns=["id", "kind", "parent_op", "name", "input_dims", "input_types"])
    ops = events[events["kind"] == "op"]
    groups = cost_groups(ops)
    assert len(groups.costs) == 2 and groups.group_ids.tolist() == [0, 0, 1]
    grouped = kernel_costs(events, ops=ops, groups=groups)
    assert grouped["flops"].tolist() == [2 * 2 * 3 * 4, 2 * 8 * 4 * 5]
    pd.testing.assert_frame_equal(grouped, kernel_costs(events, costs_for_ops(ops)))


# -- real GPU traces -----------------------------------------------------------------------


def test_real_trace_costs_qwen():
    from advisor.importers import load

    events = load(shared_trace("qwen0.5b_infer_h100.json.gz")).events
    ops = events[events["kind"] == "op"]
    costs = costs_for_ops(ops)
    linear = costs[(ops["name"] == "aten::linear") & (costs["k"] == 1024) & (costs["n"] == 1024)]
    assert len(linear) and (linear["flops"] == 2 * 8944 * 1024 * 1024).all() and (linear["dtype"] == "bf16").all()
    sdpa = costs[ops["name"] == "aten::scaled_dot_product_attention"]
    assert (sdpa["flops"] == 2 * 16 * 16 * 559 * 559 * (64 + 64)).all()
    assert sdpa["counted"].all()
    inner = costs[ops["name"].isin(["aten::_scaled_dot_product_flash_attention", "aten::_flash_attention_forward"])]
    assert (inner["flops"] == sdpa["flops"].iloc[0]).all() and not inner["counted"].any()
    flops_known = costs["flops"].dropna()
    assert (flops_known >= 0).all()
    kernels = kernel_costs(events, costs)
    assert kernels["flops"].notna().sum() > 100
    pd.testing.assert_frame_equal(kernel_costs(events), kernels)  # looked up per distinct call


def test_real_trace_costs_resnet_2021_schema():
    from advisor.importers import load

    events = load(shared_trace("resnet50_v100_num_workers_0.pt.trace.json.gz")).events
    ops = events[events["kind"] == "op"]
    costs = costs_for_ops(ops)
    stem = costs[(ops["name"] == "aten::cudnn_convolution") & (costs["kernel"] == "7x7")]
    assert len(stem) and (stem["flops"] == 2 * 32 * 112 * 112 * 64 * 3 * 49).all()
    assert (stem["dtype"] == "tf32-eligible").all() and (stem["c_in"] == 3).all()
    backward = costs[ops["name"] == "aten::cudnn_convolution_backward"]
    assert backward["flops"].notna().all() and backward["counted"].all()
