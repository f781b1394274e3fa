"""cpu-threads-oversubscribed: torch runs more operator threads than the job has cores.

Judged from the device table (torch's threads, the cores the job may use) and the
cpu_threads table (each operator's time and the share of it fewer threads keep, from a
probe the collector timed on this machine after the run at both thread counts). The saving
is the step replayed with each operator's time cut to that share; the low end keeps half of
the cut, the high end takes half as much again (the probe's adds and matmuls are not the
job's operators).
"""

from __future__ import annotations

import math

from advisor.findings import Finding
from advisor.rules.checks.common import ms, pct, row_evidence, severity_by_share, value
from advisor.rules.registry import RuleContext, register
from advisor.rules.savings import replayed
from advisor.session.busy import busy_share
from advisor.step.whatif import Fix
from advisor.tables.cpu_threads import thread_spans


@register("cpu-threads-oversubscribed")
def check(ctx: RuleContext) -> list[Finding]:
    device = ctx.table("device")
    table = ctx.table("cpu_threads")
    if ctx.model is None or table is None or not len(table) or device is None:
        return []
    threads = value(device, "cpu", "torch_threads")
    cores = value(device, "cpu", "probe_threads")
    if threads is None or cores is None or not threads > cores:
        return []
    spans = thread_spans(ctx.model.facts)
    if not spans:
        return []

    def fix(scale: float, what: str) -> Fix:
        return Fix(what, host_spans=tuple((where, min(max(1.0 - (1.0 - kept) * scale, 0.0), 1.0))
                                          for where, kept in spans))

    fewer = fix(1.0, f"{cores:.0f} operator threads")
    found = replayed(ctx, fewer,
                     f"the step replayed with each operator's time cut to the share a probe of adds and matmuls at "
                     f"{threads:.0f} and at {cores:.0f} threads kept, read at the operator's own length",
                     low=fix(0.5, "half the probe's saving"), high=fix(1.5, "half as much again"),
                     remains=f"The step keeps its operators' work on {cores:.0f} threads, one a core, and its Python.")
    if found is None:
        return []
    estimate, _ = found
    if estimate.ms_per_step < ctx.threshold("min_saving_ms") or estimate.share_of_step < ctx.threshold("min_share"):
        return []
    recorded = float(table["ns_per_step"].sum())
    saved = float(table["saved_ns_per_step"].sum())
    top = table.index[0]
    speedup = value(device, "cpu", "threads_speedup")
    message = (f"torch runs {threads:.0f} operator threads on the {cores:.0f} cores this job may use (its CPU "
               f"affinity and quota): each parallel operator is split into {threads:.0f} parts that take turns on "
               f"{cores:.0f} cores, and ends when the last part gets one. Timed after the run on this machine, "
               f"parallel adds and matmuls took {speedup:.2f}x as long at {threads:.0f} threads as at "
               f"{cores:.0f}, the short ones most. Read at each operator's own length, the recorded steps' "
               f"operators ({ms(recorded)} a step as recorded) would keep {pct(1 - saved / recorded)} of their time; "
               f"{top} the most.")
    busy = busy_share(ctx.model.session.meta.trace_metadata)
    if busy:
        message += (f" The machine was busy (the main thread waited for a core {pct(busy)} of the run): the probe "
                    "timed it as loaded then, and with other processes holding the cores the best count may be "
                    "lower still.")
    return [Finding(
        rule=ctx.spec.id,
        title=ctx.spec.title,
        severity=severity_by_share(ctx, estimate.share_of_step),
        confidence=0.6,
        saving=estimate,
        message=message,
        recommendation=(f"Set torch's threads to the cores the job may use: torch.set_num_threads({cores:.0f}), or "
                        "torch.set_num_threads(len(os.sched_getaffinity(0))) so the script fits any machine (and "
                        "fewer where DataLoader workers share those cores); OMP_NUM_THREADS and MKL_NUM_THREADS set "
                        "the same where the script does not. A thread count copied from a bigger machine is the "
                        "usual cause."),
        evidence=[e for e in (
            row_evidence("device", device, "cpu", "torch_threads", "torch.get_num_threads() as the script left it"),
            row_evidence("device", device, "cpu", "usable_cores", "the CPU affinity and quota, the fewer"),
            row_evidence("device", device, "cpu", "threads_speedup",
                         f"the probe's time at {threads:.0f} threads over at {cores:.0f}")
            if speedup is not None and not math.isnan(float(speedup)) else None,
            row_evidence("cpu_threads", table, str(top), "saved_ns_per_step", "the operator fewer threads speed up most"),
        ) if e is not None],
        metrics={"torch_threads": threads, "cores": cores, "fix_threads": int(cores)},
    ).with_fix(fewer)]
