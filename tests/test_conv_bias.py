"""The conv_bias table and conv-bias-before-batchnorm: a convolution bias the next batch
norm cancels, on hand-made sessions and tables and on the real ResNet-50 trace."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import shared_trace
from builders import Trace

from advisor.importers import load
from advisor.rules import RuleContext, builtin_specs, run_rules
from advisor.rules.engine import checks
from advisor.tables import compute_tables

MS = 1_000_000
TYPES = '["float","float","float","ScalarList","ScalarList","ScalarList","Scalar"]'
BN_TYPES = '["float","float","float","float","float","Scalar","Scalar","Scalar","Scalar"]'


def block_session(*, bias: bool = True, then: str = "aten::batch_norm"):
    """One 10 ms step: conv2d 3 -> 32 on 16x3x32x32, BatchNorm's batch counter, then ``then``."""
    t = Trace()
    t.step(1, 0, 10)
    t.phase("Forward", 0, 10)
    t.op("aten::conv2d", 1, 2, input_dims=f"[[16,3,32,32],[32,3,3,3],{'[32]' if bias else '[]'},[],[],[],[]]",
         input_types=TYPES if bias else TYPES.replace('"float","ScalarList"', '"","ScalarList"', 1))
    t.op("aten::add_", 2, 2.01, input_dims="[[],[],[]]", input_types='["long int","long int","Scalar"]')
    t.op(then, 2.1, 3, input_dims="[[16,32,32,32],[32],[32],[32],[32],[],[],[],[]]", input_types=BN_TYPES)
    return t.session()


def test_a_biased_convolution_before_batch_norm_is_found_past_the_batch_counter():
    table = compute_tables(block_session(), ["conv_bias"])["conv_bias"]
    (key,) = table.index
    assert table.at[key, "layer"] == "Conv2d(3, 32, kernel 3x3) on 16x3x32x32"
    assert table.at[key, "output_bytes"] == 16 * 32 * 32 * 32 * 4 and table.at[key, "calls_per_step"] == 1


@pytest.mark.parametrize("kw", [{"bias": False}, {"then": "aten::layer_norm"}])
def test_no_bias_or_no_batch_norm_after_it_is_left_alone(kw):
    assert compute_tables(block_session(**kw), ["conv_bias"])["conv_bias"].empty


def test_the_saving_is_three_passes_over_the_output_at_the_bandwidth():
    spec = next(s for s in builtin_specs() if s.id == "conv-bias-before-batchnorm")
    convs = pd.DataFrame({"layer": ["Conv2d(3, 32, kernel 3x3) on 16x3x32x32"], "calls": [10], "calls_per_step": [1.0],
                          "channels": [32], "output_bytes": [2_097_152], "bytes_per_step": [2_097_152.0],
                          "example_event": [3]}, index=["aten::conv2d [...]"])
    ceilings = pd.DataFrame({"peak_bytes_per_s": [1e11]}, index=["cuda cores fp32"])
    ctx = RuleContext(tables={"conv_bias": convs, "roofline_ceilings": ceilings}, spec=spec, step_count=10,
                      mean_step_ns=10 * MS, window_ns=100 * MS, gpu_measured=True)
    (finding,) = checks()["conv-bias-before-batchnorm"](ctx)
    assert finding.saving.ms_per_step == pytest.approx(3 * 2_097_152 / 1e11 * 1e3, rel=1e-3)
    assert "bias=False" in finding.recommendation and "Conv2d(3, 32, kernel 3x3)" in finding.message
    # On a CPU oneDNN adds the bias inside the convolution: only the gradient's pass remains.
    cpu = RuleContext(tables={"conv_bias": convs, "roofline_ceilings": ceilings.assign(unit="cpu")}, spec=spec,
                      step_count=10, mean_step_ns=10 * MS, window_ns=100 * MS, gpu_measured=False)
    (finding,) = checks()["conv-bias-before-batchnorm"](cpu)
    assert finding.saving.ms_per_step == pytest.approx(2_097_152 / 1e11 * 1e3, abs=1e-4)
    unknown = RuleContext(tables={"conv_bias": convs}, spec=spec, step_count=10, mean_step_ns=10 * MS,
                          window_ns=100 * MS, gpu_measured=False)
    (finding,) = checks()["conv-bias-before-batchnorm"](unknown)
    assert finding.saving.ms_per_step == 0 and "not known" in finding.message


def test_torchvision_resnet_has_no_bias_before_its_batch_norms():
    session = load(shared_trace("resnet50_v100_num_workers_4.pt.trace.json.gz"))
    tables = compute_tables(session)
    assert tables["conv_bias"].empty
    assert "conv-bias-before-batchnorm" not in {f.rule for f in run_rules(session, tables).findings}
