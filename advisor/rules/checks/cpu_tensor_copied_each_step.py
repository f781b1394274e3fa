"""cpu-tensor-copied-each-step: tensors made on the host only to be copied to the GPU.

``torch.randn(n).cuda()`` fills host memory, then copies it from pageable memory to the
device, every step; ``torch.randn(n, device="cuda")`` is one kernel. The fresh_copies
table finds the pairs (the making operator right before the copy, outside data loading)
and their user line where stacks were recorded. Data from Python values
(``torch.tensor(values).to(device)``) must cross once, but not every step when the values
stay the same: that case is named too, with the advice to make it once.
"""

from __future__ import annotations

from advisor.findings import Evidence, Finding
from advisor.rules.checks.common import gpu_idle_per_step, ms, pct, row_evidence, saving, severity_by_share
from advisor.rules.registry import RuleContext, register


@register("cpu-tensor-copied-each-step")
def check(ctx: RuleContext) -> list[Finding]:
    copies = ctx.table("fresh_copies")
    step = ctx.mean_step_ns or 0.0
    if copies is None or not len(copies) or not step:
        return []
    every = copies[copies["calls_per_step"].astype(float) >= ctx.threshold("min_calls_per_step")]
    if not len(every):
        return []
    idle = gpu_idle_per_step(ctx)
    make_cost = ctx.threshold("device_make_us") * 1e3
    host = float(every["host_per_step_ns"].sum())
    gpu = float(every["copy_per_step_ns"].sum())
    calls = float(every["calls_per_step"].sum())
    removable = max(host - calls * make_cost, 0.0)
    point = removable if idle is None else min(removable, idle)
    point = max(point, gpu)
    if point < ctx.threshold("min_saving_ms") * 1e6:
        return []
    high = removable + gpu if idle is None else min(removable, idle) + gpu
    generated = every[every["made_from"] == "generated"]
    parts, evidence = [], []
    for key, item in every.head(int(ctx.threshold("max_listed"))).iterrows():
        where = f" at {item['source']}" if item["source"] else ""
        how = "pageable, the host waits for it" if bool(item["pageable"]) else "pinned"
        parts.append(f"{item['made_by']} then {item['copy_op']}{where}: {float(item['calls_per_step']):.1f} a step, "
                     f"{float(item['bytes_per_step']) / 1e6:.2f} MB ({how}), {ms(float(item['host_per_step_ns']))} of "
                     "host time per step")
        evidence.append(row_evidence("fresh_copies", copies, key, "host_per_step_ns",
                                     "host time making the tensor and copying it"))
        file, _, line = str(item["source"]).rpartition(":")
        if file and line.isdigit():
            evidence.append(Evidence(kind="source_line", file=file, line=int(line), name=str(item["made_by"]),
                                     note=f"{item['made_by']} made on the host, then copied to the device"))
        evidence.append(Evidence(kind="event", event_id=int(item["example_event"]), name=str(item["copy_op"]),
                                 note="one of the copies"))
    message = (f"Each step makes {calls:.0f} tensor{'s' if calls >= 1.5 else ''} on the host and copies "
               f"{'them' if calls >= 1.5 else 'it'} to the GPU right away: " + "; ".join(parts)
               + f". Together {ms(host)} of host time per step ({pct(host / step)} of the step) and {ms(gpu)} of copies.")
    advice = []
    if len(generated):
        advice.append("make generated tensors where they are used: torch.randn(shape, device=device), "
                      "torch.zeros(..., device=device), torch.arange(n, device=device) (one kernel, no copy)")
    if len(generated) < len(every):
        advice.append("for tensors from Python values, build them once before the loop if the values do not change "
                      "(a buffer on the model: self.register_buffer(...)), else torch.tensor(values, device=device) "
                      "and pinned memory with non_blocking=True")
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, point / step),
        confidence=0.75 if len(generated) == len(every) else 0.6,
        saving=saving(ctx, point, "the host time making and copying the tensors less a kernel each on the device, "
                                  "at most the GPU's idle time per step; at least the copies' own GPU time",
                      low_ns=point * ctx.threshold("saving_low_share"), high_ns=high,
                      remains="The step keeps a kernel per tensor made on the device, and any copy of data that "
                              "really comes from the host."),
        message=message,
        recommendation="Create the tensors on the device: " + "; ".join(advice) + ".",
        evidence=[e for e in evidence if e is not None],
        metrics={"calls_per_step": calls, "host_per_step_ns": host, "copy_per_step_ns": gpu},
    )]
