"""Summary tables: pure functions of a Session, one DataFrame each (the Paddle profiler's
summary tables, plus host_sync and gpu_idle for the rules, and step_phases, gpu_timeline
and roofline_ceilings for the charts of the HTML report).

Every frame has an index named "key" of stable, unique string row keys, snake_case columns,
times in integer nanoseconds (``*_ns``) and ratios in 0..1. NaN means "not measured"
(GPU columns of a CPU-only session) or "not recorded"; 0 means measured and none. A table
with nothing to show is an empty frame that still has its columns. ``TABLE_DOCS`` holds each
table's title, description, column meanings and what its row keys are; ``frame.attrs``
carries the same plus ``notes`` (what was not measured and why).

    compute_tables(session)              -> {name: frame} for every table
    compute_tables(session, ["model"])   -> just those
    TABLES["kernel"](session)            -> one table

The tables are pure functions of the Session: computed one after another in this
process, nothing forked, nothing kept between calls.

One module per table (or pair of tables), registered with ``@table`` in ``_registry``:

    device, overview, model_summary (the model table), operator (+ operator_kernels), kernel, memory, userdefined,
    distributed, perf        the Paddle profiler's summary tables
    host_sync, gpu_idle      the host's waits on the GPU, and the GPU's idle time by what
                             the host was doing (for the rules)
    gpu_idle_host            the idle time no operator explains, by the Python function or
                             range the host was in, inside the model's phases or outside
    gpu_origin               GPU time by what started it: eager, CUDA graphs, Triton
    optimizer                each optimizer's step and zero_grad: cost and implementation
    autograd_anomaly         what autograd's anomaly detection, left on, costs a step
    autograd_nodes           backward's work by kind of autograd node, beside where the
                             forward operators that made them ran (in the model or outside)
    inference_autograd       the autograd nodes a loop that never runs backward records
    cpu_threads              where torch's threads outnumber the cores: each operator's time
                             and the share fewer threads keep, from a probe after the run
    batch_loops              Python loops over a batch's rows (a select per row), their body,
                             forward time, autograd nodes and source line
    fresh_copies             host tensors made right before their copy to the GPU
    conv_bias                convolutions whose bias the next batch norm cancels
    step_gpu                 per step, the GPU's work against the host's: busy time, short
                             kernels, launches, the GPU's tail after the last launch
    roofline, ceilings       op costs against the target's ceilings (roofline_ceilings)
    kernel_counters          Nsight Compute's counters for the kernels profiled (an ncu export
                             the session carries), matched to the session's kernels
    timeline                 step_phases and gpu_timeline, for the HTML report's charts
    step_timing              every step timed, recorded or not: the job's own pace and
                             what recording cost
    python_hotspots          host time per line of the user's Python, from stack samples
                             (+ periodic_work: what the steps that run extra work every N
                             steps spend it on, line by line)
    dataloaders              each DataLoader: how it makes batches, where a batch's time goes
    collection               what the profile does not cover, and why
    comparison               two profiles set side by side (`advisor compare`): their tables'
                             figures and findings, before and after, and what moved most
    job                      a job's cross-rank tables (ranks, collectives), from its ranks'
                             figures and collective calls; not a session's (JOB_TABLE_DOCS)

Shared work lives in private modules below them: ``_facts`` (what several tables need
from one session, worked out once) and ``_op_costs`` (op calls and their costs). A new
table is a module here with a ``@table`` function, imported below and named in _ORDER.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pandas as pd

from advisor.errors import UsageError
from advisor.session import Session
from advisor.step import StepModel, build_step_model
from advisor.tables import (  # noqa: F401  (importing a module registers its tables)
    autograd_anomaly,
    autograd_nodes,
    batch_loops,
    ceilings,
    collection,
    conv_bias,
    cpu_threads,
    dataloaders,
    device,
    distributed,
    fresh_copies,
    gpu_idle,
    gpu_idle_host,
    gpu_origin,
    host_sync,
    inference_autograd,
    kernel,
    kernel_counters,
    memory,
    model_summary,
    operator,
    optimizer,
    overview,
    perf,
    python_hotspots,
    roofline,
    step_gpu,
    step_timing,
    timeline,
    userdefined,
)
from advisor.tables._registry import SPECS, TableDoc, TableSpec
from advisor.tables.job import JOB_TABLE_DOCS

__all__ = ["JOB_TABLE_DOCS", "TABLES", "TABLE_DOCS", "TableDoc", "TableSpec", "compute_tables", "table_names"]

_ORDER = (
    "device",
    "overview",
    "model",
    "operator",
    "operator_kernels",
    "kernel",
    "memory",
    "userdefined",
    "distributed",
    "perf",
    "step_timing",
    "dataloaders",
    "python_hotspots",
    "periodic_work",
    "host_sync",
    "gpu_idle",
    "gpu_idle_host",
    "step_gpu",
    "gpu_origin",
    "optimizer",
    "autograd_anomaly",
    "autograd_nodes",
    "inference_autograd",
    "batch_loops",
    "fresh_copies",
    "conv_bias",
    "cpu_threads",
    "roofline",
    "roofline_ceilings",
    "kernel_counters",
    "step_phases",
    "gpu_timeline",
    "collection",
)
TABLES: dict[str, TableSpec] = {name: SPECS[name] for name in _ORDER}
TABLE_DOCS: dict[str, TableDoc] = {name: spec.doc for name, spec in TABLES.items()}


def table_names() -> list[str]:
    return list(TABLES)


_BETWEEN_MIN_EVENTS = 1_000_000  # below, giving memory back after each table costs more than it gives


def compute_tables(session: Session, names: Iterable[str] | None = None, *,
                   between: Callable[[], None] | None = None,
                   model: StepModel | None = None) -> dict[str, pd.DataFrame]:
    """The named tables (all by default) for ``session`` as its step model sees it (the
    steady window; advisor.step), sharing work between them: ``model``, the step model
    already built for it (its ``.session`` is then the steady one), else built here from
    ``session`` as read. ``between()`` runs after each table of a large session: the
    command's way to give back the memory a table's work freed (advisor.importers.pages),
    which keeps a 1 GB trace's peak lower."""
    wanted = table_names() if names is None else list(names)
    unknown = [n for n in wanted if n not in TABLES]
    if unknown:
        raise UsageError(f"unknown table {unknown[0]!r}; the tables are: {', '.join(TABLES)}")
    step_model = model if model is not None else build_step_model(session)
    steady, facts = step_model.session, step_model.facts
    large = between is not None and len(steady.events) >= _BETWEEN_MIN_EVENTS
    done = {}
    for name in wanted:
        done[name] = TABLES[name](steady, facts=facts)
        if large:
            between()
    return done


