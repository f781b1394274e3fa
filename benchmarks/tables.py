"""Time every summary table on a synthetic session of a few million events.

    python benchmarks/tables.py [--launches 500000] [--steps 20]

Each launch is a top-level op with a nested op, a cudaLaunchKernel inside it and the
kernel it launched (four events), on two host threads and four streams, with steps,
phases, some pageable copies and stream syncs: enough of every kind that no table is
trivially empty. Prints the seconds per table and for all of them together.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from advisor.session import (
    CollectorInfo,
    DeviceInfo,
    Session,
    SessionMeta,
    conform_events,
)
from advisor.step.facts import Facts
from advisor.tables import TABLES, compute_tables


def synthetic_session(launches: int, steps: int, seed: int = 0) -> Session:
    rng = np.random.default_rng(seed)
    n = launches
    gap = 20_000  # ns between launches
    op_start = np.arange(n, dtype=np.int64) * gap
    op_end = op_start + rng.integers(5_000, 15_000, n)
    tid = np.where(np.arange(n) % 5 == 0, 2, 1)
    op_names = np.array([f"aten::op{i}" for i in range(200)], dtype=object)[rng.integers(0, 200, n)]
    kernel_names = np.array([f"kernel_{i}<float>" for i in range(300)], dtype=object)[rng.integers(0, 300, n)]
    kind_of_gpu = np.where(np.arange(n) % 50 == 0, "memcpy", "kernel")
    gpu_start = op_start + 8_000 + rng.integers(0, 30_000, n)
    gpu_end = gpu_start + rng.integers(1_000, 40_000, n)

    # Row layout: [top ops | nested ops | launches | gpu events | steps | phases]
    top = np.arange(n)
    nested = n + top
    call = 2 * n + top
    span = int(op_end[-1]) + 100_000
    bounds = np.linspace(0, span, steps + 1).astype(np.int64)
    step_no = np.searchsorted(bounds, op_start, side="right") - 1
    phase_names = np.array(["Dataloader", "Forward", "Backward", "Optimization"], dtype=object)
    phase_of = phase_names[(op_start - bounds[step_no]) * 4 // (bounds[step_no + 1] - bounds[step_no])]

    call_names = np.where(np.arange(n) % 97 == 0, "cudaStreamSynchronize",
                          np.where(kind_of_gpu == "memcpy", "cudaMemcpyAsync", "cudaLaunchKernel"))
    frames = {
        "name": np.concatenate([op_names, np.char.add(op_names.astype(str), "_inner").astype(object), call_names,
                                np.where(kind_of_gpu == "memcpy", "Memcpy HtoD (Pageable -> Device)", kernel_names)]),
        "kind": np.concatenate([np.full(2 * n, "op"), np.full(n, "runtime"), kind_of_gpu]),
        "start_ns": np.concatenate([op_start, op_start + 500, op_start + 1_000, gpu_start]),
        "end_ns": np.concatenate([op_end, op_end - 500, op_start + 4_000, gpu_end]),
        "pid": np.concatenate([np.ones(3 * n, np.int64), np.zeros(n, np.int64)]),
        "tid": np.concatenate([tid, tid, tid, 7 + top % 4]),
        "device": np.concatenate([np.full(3 * n, -1), np.zeros(n, np.int64)]),
        "stream": np.concatenate([np.full(3 * n, -1), 7 + top % 4]),
        "launch": np.concatenate([np.full(3 * n, -1), call]),
        "parent_op": np.concatenate([np.full(n, -1), top, nested, nested]),
        "top_op": np.concatenate([top, top, top, top]),
        "step": np.tile(step_no, 4),
        "phase": np.tile(phase_of, 4),
        "src_memory": np.concatenate([np.full(3 * n, ""), np.where(kind_of_gpu == "memcpy", "Pageable", "")]),
        "copy_kind": np.concatenate([np.full(3 * n, ""), np.where(kind_of_gpu == "memcpy", "HtoD", "")]),
        "bytes": np.concatenate([np.full(3 * n, -1), np.full(n, 1 << 20)]),
    }
    events = pd.DataFrame(frames)
    marks = []
    for i in range(steps):
        marks.append({"name": f"ProfilerStep#{i}", "kind": "step", "start_ns": bounds[i], "end_ns": bounds[i + 1],
                      "pid": 1, "tid": 1, "step": i})
        quarter = (bounds[i + 1] - bounds[i]) // 4
        for j, phase in enumerate(phase_names):
            marks.append({"name": phase, "kind": "phase", "start_ns": bounds[i] + j * quarter,
                          "end_ns": bounds[i] + (j + 1) * quarter, "pid": 1, "tid": 1, "step": i, "phase": phase})
    events = pd.concat([events, pd.DataFrame(marks)], ignore_index=True)
    meta = SessionMeta(
        source="synthetic", source_format="synthetic",
        collector=CollectorInfo(name="synthetic", gpu_measured=True),
        devices=[DeviceInfo(id=-1, kind="cpu"), DeviceInfo(id=0, kind="gpu", name="synthetic GPU")],
    )
    return Session(meta, conform_events(events))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=500_000)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    t0 = time.perf_counter()
    session = synthetic_session(args.launches, args.steps)
    print(f"built {len(session.events):,} events in {time.perf_counter() - t0:.1f} s")
    facts = Facts(session)
    for name, spec in TABLES.items():
        t0 = time.perf_counter()
        frame = spec(session, facts=facts)
        print(f"{name:18s} {time.perf_counter() - t0:6.2f} s  {len(frame):6d} rows")
    t0 = time.perf_counter()
    compute_tables(session)
    print(f"{'all (fresh)':18s} {time.perf_counter() - t0:6.2f} s")


if __name__ == "__main__":
    main()
