"""Device Summary: how busy each device was in the profiled window."""

from __future__ import annotations

import numpy as np
import pandas as pd

from advisor import intervals as iv
from advisor.tables._facts import Facts
from advisor.tables._registry import table, with_notes

HOST_BUSY_KINDS = ("op", "runtime", "driver")


@table(
    "device",
    title="Device Summary",
    description=(
        "One row per device. GPU busy time is the union of its kernels, copies and sets "
        "inside the window; CPU busy time is the union of operators and CUDA API calls on the "
        "host threads (time in Python outside operators is not counted). Without a measured "
        "GPU there are no GPU rows and the cpu row's note says why."
    ),
    key='"cpu" or "gpu:N" (N the device ordinal)',
    columns={
        "name": "Device name as recorded.",
        "kind": "'cpu' or 'gpu'.",
        "busy_ns": "Union of the device's activity inside the window, ns.",
        "kernel_busy_ns": "GPU: union of kernels alone inside the window, ns (copies and sets excluded).",
        "window_ns": "Length of the window, ns.",
        "utilization": "busy_ns / window_ns (0..1).",
        "kernel_utilization": "kernel_busy_ns / window_ns (0..1); the Paddle profiler's GPU utilisation.",
        "sm_count": "Streaming multiprocessors, where known.",
        "compute_capability": "e.g. '8.0', where known.",
        "memory_bytes": "Device memory, where known.",
        "memory_bandwidth_gbps": "Peak memory bandwidth in GB/s, where known.",
        "note": "What was not measured, where something was not.",
    },
)
def device_table(f: Facts) -> pd.DataFrame:
    lo, hi = f.window
    rows: dict[str, dict] = {}
    infos = {d.id: d for d in f.meta.devices}
    cpu = next((d for d in f.meta.devices if d.kind == "cpu"), None)
    cpu_busy = f.busy(*HOST_BUSY_KINDS).length
    rows["cpu"] = {
        "name": cpu.name if cpu is not None and cpu.name else "host CPU",
        "kind": "cpu",
        "busy_ns": cpu_busy,
        "kernel_busy_ns": np.nan,
        "sm_count": np.nan,
        "compute_capability": None,
        "memory_bytes": cpu.total_memory_bytes if cpu is not None else None,
        "memory_bandwidth_gbps": cpu.memory_bandwidth_gbps if cpu is not None else None,
        "note": "" if f.gpu_measured else f.gpu_not_measured_reason,
    }
    if f.gpu_measured:
        gpu = f.gpu
        s = np.clip(gpu["start_ns"].to_numpy(), lo, hi)
        e = np.clip(gpu["end_ns"].to_numpy(), lo, hi)
        kept = e > s
        s, e = s[kept], e[kept]
        devices = gpu["device"].to_numpy()[kept]
        is_kernel = (gpu["kind"] == "kernel").to_numpy()[kept]
        busy = iv.grouped_union_length(devices, (s, e))
        kernel_busy = iv.grouped_union_length(devices[is_kernel], (s[is_kernel], e[is_kernel]))
        ids = sorted({d.id for d in f.meta.devices if d.kind == "gpu"} | {int(x) for x in np.unique(gpu["device"])})
        for dev in ids:
            info = infos.get(dev)
            rows[f"gpu:{dev}"] = {
                "name": info.name if info is not None and info.name else f"GPU {dev}",
                "kind": "gpu",
                "busy_ns": int(busy.get(dev, 0)),
                "kernel_busy_ns": int(kernel_busy.get(dev, 0)),
                "sm_count": info.sm_count if info is not None else None,
                "compute_capability": info.compute_capability if info is not None else None,
                "memory_bytes": info.total_memory_bytes if info is not None else None,
                "memory_bandwidth_gbps": info.memory_bandwidth_gbps if info is not None else None,
                "note": "",
            }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out["window_ns"] = f.window_ns
    out["utilization"] = f.ratio(out["busy_ns"].astype("float64"), f.window_ns)
    out["kernel_utilization"] = f.ratio(out["kernel_busy_ns"].astype("float64"), f.window_ns)
    for column in ("sm_count", "memory_bytes", "memory_bandwidth_gbps"):
        out[column] = pd.to_numeric(out[column], errors="coerce")
    if not f.gpu_measured:
        with_notes(out, f.gpu_not_measured_note)
    return out
