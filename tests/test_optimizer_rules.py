"""The optimizer table and the rules that read it (optimizer-not-fused,
grad-zeroing-memsets): hand-made sessions with known answers, and the real traces."""

from __future__ import annotations

import pytest
from conftest import shared_trace
from builders import Trace

from advisor.importers import load
from advisor.rules import run_rules
from advisor.tables import compute_tables

MS = 1_000_000
STEP = "Optimizer.step#SGD.step"
ZERO = "Optimizer.zero_grad#SGD.zero_grad"


def optimizer_session(*, params: int = 40, foreach: bool = False, set_to_none: bool = False, gpu: bool = True,
                      gemm_ms: float = 4.5, steps: int = 2, step_range: str = STEP,
                      per_param: tuple[str, ...] = ("aten::mul_", "aten::add_"), step_ms: float = 8.0,
                      large_every: int | None = 0, launches: bool | None = None):
    """``steps`` 20 ms steps (two by default): zero_grad (1-3 ms), a forward matmul, then the
    optimizer step (``step_ms`` from 10 ms, the range ``step_range``). Single-tensor: the ops ``per_param``
    for each parameter (SGD with momentum's two by default), each launching a 5 us kernel.
    Each op's first input is a float tensor of 1 MiB, 64 MiB for every ``large_every``-th
    parameter (0: none; no shapes recorded where ``large_every`` is None). ``launches``
    (default: ``gpu``): the ops call cudaLaunchKernel (without ``gpu``, a GPU job whose GPU
    the trace did not record)."""
    launches = gpu if launches is None else launches
    t = Trace()
    for number, base in ((n + 1, 20.0 * n) for n in range(steps)):
        t.step(number, base, base + 20)
        t.phase("Optimization", base + 1, base + 3)
        t.add(ZERO, "annotation", base + 1, base + 3)
        if not set_to_none:
            for i in range(params):
                start = base + 1 + i * 2 / params
                op = t.op("aten::zero_", start, start + 1.5 / params)
                launch = t.call("cudaLaunchKernel", start + 0.5 / params, start + 1 / params, parent=op) \
                    if launches else None
                if gpu:
                    t.gpu("FillFunctor", "kernel", start + 1 / params, start + 1 / params + 0.005, launch=launch)
        t.phase("Forward", base + 3, base + 10)
        mm = t.op("aten::mm", base + 4, base + 5)
        launch = t.call("cudaLaunchKernel", base + 4.2, base + 4.4, parent=mm) if launches else None
        if gpu:
            t.gpu("gemm", "kernel", base + 4.5, base + 4.5 + gemm_ms, launch=launch)
        t.phase("Optimization", base + 10, base + 18)
        t.add(step_range, "annotation", base + 10, base + 10 + step_ms)
        names = ["aten::_foreach_mul_", "aten::_foreach_add_"] if foreach else list(per_param) * params
        for i, name in enumerate(names):
            start = base + 10 + i * step_ms / len(names)
            param = i // len(per_param)
            rows = 64 if large_every and param % large_every == 0 else 1
            shapes = {} if large_every is None else {"input_dims": f"[[{rows * 1024},256],[{rows * 1024},256]]",
                                                     "input_types": '["float","float"]'}
            op = t.op(name, start, start + 0.75 * step_ms / len(names), **shapes)
            if not launches:
                continue
            launch = t.call("cudaLaunchKernel", start + step_ms / 8 / len(names), start + step_ms / 4 / len(names),
                            parent=op)
            if gpu:  # on a stream of their own: a long matmul does not hold them
                kernel_start = start + step_ms / 4 / len(names)
                t.gpu("elementwise", "kernel", kernel_start, kernel_start + 0.005, launch=launch, stream=8, tid=8)
    return t.session(gpu_measured=gpu)


def test_the_table_tells_the_implementations_apart_and_counts_per_step():
    table = compute_tables(optimizer_session(), ["optimizer"])["optimizer"]
    assert table.at[STEP, "implementation"] == "single-tensor" and table.at[STEP, "ops_per_step"] == 80
    assert table.at[STEP, "kernels_per_step"] == 80 and table.at[STEP, "distinct_ops"] == 2
    assert table.at[STEP, "op_host_per_step_ns"] == pytest.approx(80 * 6 / 80 * MS)
    assert table.at[ZERO, "implementation"] == "zero_" and table.at[ZERO, "zero_ops_per_step"] == 40
    fixed = compute_tables(optimizer_session(foreach=True, set_to_none=True), ["optimizer"])["optimizer"]
    assert fixed.at[STEP, "implementation"] == "foreach" and fixed.at[STEP, "ops_per_step"] == 2
    assert fixed.at[ZERO, "implementation"] == "set_to_none" and fixed.at[ZERO, "zero_ops_per_step"] == 0


def _rules(session):
    return {f.rule: f for f in run_rules(session, compute_tables(session)).findings}


def test_single_tensor_steps_and_zeroed_gradients_on_a_gpu_are_named_with_their_fix():
    found = _rules(optimizer_session())
    step, zero = found["optimizer-not-fused"], found["grad-zeroing-memsets"]
    assert "80 operators a step" in step.message and "foreach=True" in step.recommendation
    # The step replayed with the optimizer step's 8 ms call (its operators and the Python
    # loop over the parameters between them) cut to the quarter a foreach step keeps; at
    # most to one operator per kind. The GPU idles meanwhile: the step loses all of it.
    assert step.saving.ms_per_step == pytest.approx(8 * 0.75)
    assert step.saving.high_ms_per_step == pytest.approx(8 * (1 - 2 / 80))
    assert "40 aten::zero_ calls" in zero.message and "set_to_none=True" in zero.recommendation
    # zero_grad's 2 ms call keeps its Python loop (the 0.5 ms its zero_ ops leave) and loses
    # the 1.5 ms of zero_ ops and their fill kernels.
    assert zero.saving.ms_per_step == pytest.approx(1.5)


def test_the_fixed_twin_raises_neither_and_a_cpu_run_no_zeroing_advice():
    assert not {"optimizer-not-fused", "grad-zeroing-memsets"} & set(_rules(optimizer_session(foreach=True,
                                                                                              set_to_none=True)))
    # On a CPU fresh gradients cost allocations: no zeroing advice there.
    assert "grad-zeroing-memsets" not in _rules(optimizer_session(gpu=False))


def test_a_gpu_job_whose_gpu_the_trace_missed_is_not_told_the_cpu_s_fix():
    # The ops launch kernels the trace holds none of: the parameters are on a GPU, and the
    # CPU's shares would size nothing real (profile-incomplete names the missing GPU).
    assert "optimizer-not-fused" not in _rules(optimizer_session(gpu=False, launches=True))


def test_a_cpu_run_judged_for_a_gpu_is_not_told_the_cpu_s_fix():
    # advisor diagnose --gpu A100 on a CPU recording: on that GPU the parameters would be
    # CUDA tensors, and torch would pick foreach there by itself.
    session = optimizer_session(gpu=False)
    assert "optimizer-not-fused" in _rules(session)
    session.meta = session.meta.model_copy(update={"target_gpu": "a100-sxm4-80gb"})
    assert "optimizer-not-fused" not in _rules(session)


def test_a_cpu_step_is_told_to_fuse_at_the_share_a_fused_step_keeps():
    # SGD with momentum on a CPU (its buffer's mul_ and the add_s): the 8 ms step replayed
    # at the 0.6 a fused step keeps there, 0.5 at the high end, half the point at the low.
    step = _rules(optimizer_session(gpu=False))["optimizer-not-fused"]
    assert "on the CPU" in step.message and "fused=True" in step.recommendation
    assert "8.00 ms per recorded step (40.0% of the recorded step)" in step.message
    assert "torch.optim.SGD(params, ..., fused=True)" in step.recommendation
    assert "foreach=True is no help" in step.recommendation
    assert step.saving.ms_per_step == pytest.approx(8 * 0.4)
    assert step.saving.high_ms_per_step == pytest.approx(8 * 0.5)
    assert step.saving.low_ms_per_step == pytest.approx(8 * 0.2)
    # verify applies fused, and turns foreach off (torch refuses both).
    assert step.metrics["fix_fused"] == 1 and step.metrics["fix_foreach"] == 0
    adam = _rules(optimizer_session(gpu=False, step_range="Optimizer.step#AdamW.step",
                                    per_param=("aten::lerp_", "aten::mul_", "aten::addcmul_", "aten::sqrt",
                                               "aten::addcdiv_")))["optimizer-not-fused"]
    assert adam.saving.ms_per_step == pytest.approx(8 * 0.7) and adam.saving.high_ms_per_step == pytest.approx(
        8 * 0.87)
    assert "torch.optim.AdamW(params, ..., fused=True)" in adam.recommendation
    # A foreach step the script asked for is slower still: fused replaces it.
    foreach = _rules(optimizer_session(gpu=False, foreach=True, step_range="Optimizer.step#Adam.step"))
    assert "replace it" in foreach["optimizer-not-fused"].recommendation


def test_the_time_on_tensors_past_the_caches_keeps_less():
    # One parameter in four is 64 MiB: a quarter of the operators' time is on large tensors.
    table = compute_tables(optimizer_session(gpu=False, large_every=4), ["optimizer"])["optimizer"]
    assert table.at[STEP, "large_op_share"] == pytest.approx(0.25)
    assert compute_tables(optimizer_session(gpu=False), ["optimizer"])["optimizer"].at[STEP, "large_op_share"] == 0
    unshaped = compute_tables(optimizer_session(gpu=False, large_every=None), ["optimizer"])["optimizer"]
    assert unshaped[["large_op_share"]].isna().all().all()
    # SGD with momentum keeps 0.6 of the small tensors' time, 0.5 of the large ones'.
    step = _rules(optimizer_session(gpu=False, large_every=4))["optimizer-not-fused"]
    assert step.saving.ms_per_step == pytest.approx(8 * (1 - (0.75 * 0.6 + 0.25 * 0.5)))
    assert step.saving.high_ms_per_step == pytest.approx(8 * 0.5)


def test_a_cpu_step_fusing_would_not_speed_is_left_alone():
    # Plain SGD is one pass per parameter already; an optimizer torch does not fuse on a
    # CPU has nothing to set; a fused step is the fix; a 0.5 ms step would save 1 % of the
    # 20 ms step (0.2 ms), under cpu_min_share.
    for session in (optimizer_session(gpu=False, per_param=("aten::add_",)),
                    optimizer_session(gpu=False, step_ms=0.5),
                    optimizer_session(gpu=False, step_range="Optimizer.step#RMSprop.step"),
                    optimizer_session(gpu=False, step_range="Optimizer.step#Adam.step",
                                      per_param=("aten::_fused_adam_",), params=1)):
        assert "optimizer-not-fused" not in _rules(session)


def test_the_saving_is_what_the_gpu_leaves():
    # The matmul keeps the GPU busy 15.4 ms of the 20 ms step, from 4.5 ms on: the optimizer
    # step (10-18 ms) runs while the GPU is busy until 19.9, so a faster one shortens the
    # step only by what it holds past the matmul's end, whatever the host time it saves.
    session = optimizer_session(gemm_ms=15.4, steps=8)
    tables = compute_tables(session)
    step = next(f for f in run_rules(session, tables).findings if f.rule == "optimizer-not-fused")
    assert step.saving.high_ms_per_step < 8 * 0.75
    balance = tables["step_gpu"]
    idle = balance.at["mean", "step_ns"] - balance.at["mean", "gpu_busy_ns"]
    assert step.saving.high_ms_per_step * MS <= idle + 1e3


def test_resnet_trace_single_tensor_sgd_and_zeroed_gradients():
    session = load(shared_trace("resnet50_v100_num_workers_4.pt.trace.json.gz"))
    tables = compute_tables(session)
    table = tables["optimizer"]
    assert table.at[STEP, "implementation"] == "single-tensor" and table.at[STEP, "ops_per_step"] == 484
    assert table.at[ZERO, "zero_ops_per_step"] == 161  # one per parameter of ResNet-50
    rules = {f.rule for f in run_rules(session, tables).findings}
    assert {"optimizer-not-fused", "grad-zeroing-memsets"} <= rules


def test_ddp_trace_foreach_sgd_with_set_to_none_is_left_alone():
    session = load(shared_trace("ddp_cnn_a100_rank0.json.gz"))
    tables = compute_tables(session)
    table = tables["optimizer"]
    assert table.at[STEP, "implementation"] == "foreach" and table.at[ZERO, "implementation"] == "set_to_none"
    rules = {f.rule for f in run_rules(session, tables).findings}
    assert not {"optimizer-not-fused", "grad-zeroing-memsets"} & rules
