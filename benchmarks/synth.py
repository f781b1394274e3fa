"""Write a synthetic PyTorch profiler (Kineto, today's schema) trace of a training loop.

The shape follows a real one: per step a ProfilerStep range, a DataLoader range, forward
ops that each launch a kernel through cudaLaunchKernel (with ac2g flow events), backward
ops on the autograd thread, an optimizer step, and a host-to-device copy. Used by the
ingest benchmark to reach a million events and more; deterministic for a given size.

    python benchmarks/synth.py OUT.json.gz --events 1000000
    python benchmarks/synth.py OUT.json --mb 200        # about 200 MB of JSON (before any gzip)
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

EVENTS_PER_OP = 6  # op, inner op, runtime call, kernel, two flow events


def _op_block(pid: int, tid: int, ts: float, corr: int, ext: int, name: str, kernel: str) -> tuple[list[dict], float]:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": tid, "ts": round(ts, 3), "dur": 9.5,
         "args": {"External id": ext, "Input Dims": [[64, 256], [256, 256]], "Input type": ["float", "float"]}},
        {"ph": "X", "cat": "cpu_op", "name": name + "_impl", "pid": pid, "tid": tid, "ts": round(ts + 0.5, 3), "dur": 8.0,
         "args": {"External id": ext + 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": round(ts + 1.25, 3),
         "dur": 5.5, "args": {"External id": ext + 1, "cbid": 211, "correlation": corr}},
        {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": round(ts + 8.125, 3), "dur": 6.75,
         "args": {"External id": ext + 1, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": corr,
                  "registers per thread": 64, "shared memory": 16384, "grid": [128, 1, 1], "block": [256, 1, 1]}},
        {"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": round(ts + 1.25, 3), "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": round(ts + 8.125, 3), "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]
    return events, ts + 10.0


def generate(path: Path, target_events: int = 1_000_000, ops_per_step: int = 400, *,
             target_bytes: int | None = None) -> int:
    """Write the trace; returns the number of events written. With ``target_bytes`` steps
    are written until the JSON text (before any gzip) reaches that size instead."""
    pid, main, autograd = 4242, 4242, 4243
    steps = max(1, target_events // (ops_per_step * EVENTS_PER_OP + 6))
    if target_bytes is not None:
        steps = 1 << 62  # until the size is reached
    written = 0
    size = 0
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as out:
        out.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", '
                  '"totalGlobalMem": 85198045184, "computeMajor": 8, "computeMinor": 0, "numSms": 108}],\n'
                  '  "traceEvents": [\n')
        first = True

        def emit(event: dict) -> None:
            nonlocal first, written, size
            text = ("" if first else ",\n") + json.dumps(event)
            out.write(text)
            size += len(text)
            first = False
            written += 1

        ts = 1_700_000_000_000.0
        corr, ext = 1, 1
        for step in range(steps):
            if target_bytes is not None and size >= target_bytes:
                break
            start = ts
            loader = ops_per_step * 2.0
            ts += loader + 1
            half = ops_per_step // 2
            blocks = []
            for i in range(half):
                events, ts = _op_block(pid, main, ts, corr, ext, "aten::linear" if i % 2 else "aten::relu",
                                       "ampere_sgemm_128x64_tn" if i % 2 else "vectorized_elementwise_kernel")
                blocks.extend(events)
                corr += 1
                ext += 2
            for i in range(ops_per_step - half):
                events, ts = _op_block(pid, autograd, ts, corr, ext, "autograd::engine::evaluate_function: AddmmBackward0",
                                       "ampere_sgemm_64x64_nt")
                blocks.extend(events)
                corr += 1
                ext += 2
            optimizer = ts
            ts += 50
            end = ts + 5
            emit({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": main,
                  "ts": round(start, 3), "dur": round(end - start, 3), "args": {"External id": ext}})
            emit({"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                  "pid": pid, "tid": main, "ts": round(start + 0.5, 3), "dur": loader, "args": {"External id": ext + 1}})
            for event in blocks:
                emit(event)
            emit({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": pid, "tid": main,
                  "ts": round(optimizer, 3), "dur": 45.0, "args": {"External id": ext + 2}})
            emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": pid, "tid": main,
                  "ts": round(optimizer + 46, 3), "dur": 3.0, "args": {"correlation": corr, "cbid": 41}})
            emit({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7,
                  "ts": round(optimizer + 47, 3), "dur": 2.0, "args": {"device": 0, "stream": 7, "correlation": corr,
                                                                      "bytes": 1 << 20}})
            emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": pid, "tid": main,
                  "ts": round(optimizer + 49.5, 3), "dur": 4.0, "args": {"correlation": corr + 1, "cbid": 131}})
            corr += 2
            ext += 3
        out.write('\n  ],\n  "traceName": "synthetic", "displayTimeUnit": "ms", "baseTimeNanoseconds": 0\n}\n')
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--mb", type=float, help="write about this many MB of JSON instead of --events")
    args = parser.parse_args()
    target_bytes = int(args.mb * 1e6) if args.mb else None
    print(f"{generate(args.out, args.events, target_bytes=target_bytes)} events written to {args.out}")


if __name__ == "__main__":
    main()
