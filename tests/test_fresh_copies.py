"""The fresh_copies table and cpu-tensor-copied-each-step: tensors made on the host by
the operator right before their copy to the GPU, on hand-made sessions with known answers."""

from __future__ import annotations

import pytest
from builders import Trace

from advisor.rules import run_rules
from advisor.tables import compute_tables

MS = 1_000_000
STACK = "/venv/lib/python3.11/site-packages/torch/_tensor.py(10): to;train.py(42): train_step"


def copy_after(t: Trace, maker: str, start: float, *, gap: float = 0.05, mb: float = 1.0, stack: str = STACK,
               memory: str = "Pageable"):
    """``maker`` on the host (0.2 ms), then aten::to copying its result to the device (0.4 ms)."""
    t.op(maker, start, start + 0.2)
    to = t.op("aten::to", start + 0.2 + gap, start + 0.6 + gap, call_stack=stack)
    call = t.call("cudaMemcpyAsync", start + 0.25 + gap, start + 0.55 + gap, parent=to)
    t.gpu(f"Memcpy HtoD ({memory} -> Device)", "memcpy", start + 0.3 + gap, start + 0.5 + gap, launch=call,
          bytes=int(mb * 1e6), copy_kind="HtoD", src_memory=memory, dst_memory="Device")


def session(*, fixed: bool = False, gap: float = 0.05):
    """Three 10 ms steps: a Dataloader phase whose batch is copied (not fresh), then noise
    made with randn and copied; torch.tensor(values) copied; a matmul of 3 ms."""
    t = Trace()
    for number, base in ((1, 0.0), (2, 10.0), (3, 20.0)):
        t.step(number, base, base + 10)
        t.phase("Dataloader", base, base + 1)
        copy_after(t, "aten::stack", base + 0.1, stack="")  # the batch: made by collate, in the loader
        t.phase("Forward", base + 1, base + 9)
        if not fixed:
            copy_after(t, "aten::randn", base + 1.5, gap=gap)
            t.op("aten::lift_fresh", base + 3, base + 3.1)
            t.op("aten::detach_", base + 3.1, base + 3.15)
            to = t.op("aten::to", base + 3.2, base + 3.5)
            call = t.call("cudaMemcpyAsync", base + 3.25, base + 3.45, parent=to)
            t.gpu("Memcpy HtoD (Pageable -> Device)", "memcpy", base + 3.3, base + 3.4, launch=call, bytes=4096,
                  copy_kind="HtoD", src_memory="Pageable", dst_memory="Device")
        mm = t.op("aten::mm", base + 4, base + 4.5)
        t.gpu("gemm", "kernel", base + 4.6, base + 7.6, launch=t.call("cudaLaunchKernel", base + 4.1, base + 4.3,
                                                                       parent=mm))
    return t.session()


def test_copies_of_fresh_host_tensors_are_found_and_the_batch_is_not():
    table = compute_tables(session(), ["fresh_copies"])["fresh_copies"]
    assert list(table.index) == ["aten::randn -> aten::to @ train.py:42", "aten::lift_fresh -> aten::to"]
    noise = table.loc["aten::randn -> aten::to @ train.py:42"]
    assert noise["made_from"] == "generated" and noise["calls_per_step"] == 1 and noise["bytes_per_step"] == 1e6
    assert noise["host_per_step_ns"] == pytest.approx(0.6 * MS) and noise["copy_per_step_ns"] == pytest.approx(0.2 * MS)
    assert bool(noise["pageable"]) and noise["source"] == "train.py:42"
    assert table.at["aten::lift_fresh -> aten::to", "made_from"] == "python"


def test_a_maker_long_before_the_copy_is_not_its_maker():
    assert compute_tables(session(gap=3.0), ["fresh_copies"])["fresh_copies"].index.tolist() == [
        "aten::lift_fresh -> aten::to"]


def test_the_rule_names_the_line_and_advises_making_them_on_the_device():
    planted = session()
    findings = {f.rule: f for f in run_rules(planted, compute_tables(planted)).findings}
    finding = findings["cpu-tensor-copied-each-step"]
    assert "aten::randn then aten::to at train.py:42" in finding.message
    assert "device=device" in finding.recommendation and "register_buffer" in finding.recommendation
    assert ("train.py", 42) in [(e.file, e.line) for e in finding.evidence if e.kind == "source_line"]
    # randn 0.2 + its copy 0.4 ms, lift_fresh 0.1 + its copy 0.3 ms of host time, less
    # 10 us for each tensor made on the device instead.
    assert finding.saving.ms_per_step == pytest.approx(0.6 + 0.4 - 0.02)
    fixed = session(fixed=True)
    assert "cpu-tensor-copied-each-step" not in {f.rule for f in run_rules(fixed, compute_tables(fixed)).findings}
