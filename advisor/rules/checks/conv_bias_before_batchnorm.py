"""conv-bias-before-batchnorm: a convolution bias that the next batch norm cancels.

The bias costs a pass over the convolution's output forward (adding it) and one backward
(its gradient, a reduction over the output's gradient), and changes nothing: batch norm
subtracts each channel's mean. The saving is that memory traffic at the target's
bandwidth (the roofline_ceilings table); without a known bandwidth (a CPU that
`advisor calibrate` has not measured) the finding names the layers and says so.
"""

from __future__ import annotations

import math

from advisor.findings import Evidence, Finding
from advisor.rules.checks.common import ms, row_evidence, saving
from advisor.rules.registry import RuleContext, register

# Forward: read and write the output to add the bias; backward: read the output's
# gradient to sum it per channel.
PASSES = 3


@register("conv-bias-before-batchnorm")
def check(ctx: RuleContext) -> list[Finding]:
    convs = ctx.table("conv_bias")
    if convs is None or not len(convs):
        return []
    ceilings = ctx.table("roofline_ceilings")
    bandwidth = float("nan")
    if ceilings is not None and len(ceilings) and "peak_bytes_per_s" in ceilings.columns:
        bandwidth = float(ceilings["peak_bytes_per_s"].max())
    known = math.isfinite(bandwidth) and bandwidth > 0
    # oneDNN on a CPU adds the bias inside the convolution: only its gradient costs a pass.
    on_cpu = ceilings is not None and len(ceilings) and "unit" in ceilings.columns and (ceilings["unit"] == "cpu").all()
    passes = 1 if on_cpu else PASSES
    per_step = convs["bytes_per_step"].astype(float).fillna(convs["output_bytes"].astype(float))
    moved = float(per_step.sum())
    calls = float(convs["calls_per_step"].astype(float).fillna(convs["calls"].astype(float)).sum())
    point = passes * moved / bandwidth * 1e9 if known else 0.0
    layers = ", ".join(str(row["layer"]) for _, row in convs.head(3).iterrows())
    more = f" and {len(convs) - 3} more shapes" if len(convs) > 3 else ""
    message = (f"{calls:.0f} convolution call{'s' if calls != 1 else ''} a step add a bias that the batch norm right "
               f"after cancels: {layers}{more}. The bias costs {passes} pass{'es' if passes > 1 else ''} over "
               f"{moved / 1e6:.1f} MB of output a step")
    message += (f", about {ms(point)} at the device's {bandwidth / 1e9:.0f} GB/s." if known else
                "; this machine's memory bandwidth is not known (run `advisor calibrate`), so no time is put on it.")
    evidence = [row_evidence("conv_bias", convs, key, "calls_per_step") for key in convs.index[:3]]
    evidence += [Evidence(kind="event", event_id=int(row["example_event"]), name=str(key).split(" ")[0],
                          note="a convolution with a bias, followed by batch norm")
                 for key, row in convs.head(3).iterrows()]
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=ctx.spec.severity,
        confidence=0.8,
        saving=saving(ctx, point, f"{passes} pass{'es' if passes > 1 else ''} over each such convolution's output at "
                                  "the device's memory bandwidth (adding the bias forward, on a GPU, and summing its "
                                  "gradient backward)" if known else
                                  "not estimated: the memory bandwidth of this machine is unknown",
                      low_ns=point / passes if known else None, high_ns=point if known else None,
                      remains="The step keeps the convolutions and batch norms; the model computes the same "
                              "function (batch norm's own shift takes the bias's place)."),
        message=message,
        recommendation=("Build these convolutions with bias=False, e.g. nn.Conv2d(c_in, c_out, 3, padding=1, "
                        "bias=False) before nn.BatchNorm2d(c_out): batch norm's learned shift does the bias's job. "
                        "A checkpoint trained with the bias loads with strict=False once the bias is folded into "
                        "the batch norm (running_mean -= bias), which keeps its outputs the same."),
        evidence=[e for e in evidence if e is not None],
        metrics={"calls_per_step": calls, "bytes_per_step": moved, "bandwidth_bytes_per_s": bandwidth if known else None},
    )]
