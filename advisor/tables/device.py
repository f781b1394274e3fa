"""Device Summary: how busy each device was in the profiled window.

The cpu row has two kinds of figures. ``busy_ns``/``utilization`` are traced: the time the
host spent inside framework operators and CUDA API calls. The ``process_cpu_*``,
``system_cpu_utilization`` and ``peak_rss_bytes`` columns are measured by the host sampler
(advisor.collect.sampler): CPU time actually used, whatever ran (Python, a data loader's
decoding, worker processes), and time spent sleeping or waiting not counted. Samples
cover intervals of ~50 ms; a window is charged each sample's average in proportion to
how much of the sample falls inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from advisor.knowledge.cpu import CpuFeatures
from advisor.session import DeviceInfo
from advisor.session import intervals as iv
from advisor.step.facts import Facts
from advisor.tables._registry import table, with_notes

HOST_BUSY_KINDS = ("op", "runtime", "driver")
CALIBRATED_DTYPES = ("fp32", "bf16", "fp16")  # the CPU matmul peaks the device table shows


@dataclass(frozen=True)
class HostSampleSeries:
    """The session's host samples, by start: each a constant rate over [start, end)."""

    starts: np.ndarray
    ends: np.ndarray
    cores: np.ndarray  # the process's CPU use, cores
    system: np.ndarray  # the machine's CPU use, 0..1
    rss: np.ndarray  # the largest RSS read in the sample, bytes (-1: not read)

    def __len__(self) -> int:
        return len(self.starts)

    def overlaps(self, intervals: iv.Intervals) -> np.ndarray:
        """Time each sample shares with a normalised interval set, ns."""
        starts, ends = intervals.starts, intervals.ends
        if not len(starts):
            return np.zeros(len(self), dtype="float64")
        before = np.concatenate([[0], np.cumsum(ends - starts)]).astype("float64")

        def covered_until(t: np.ndarray) -> np.ndarray:  # the set's time before t
            k = np.searchsorted(starts, t, side="right") - 1
            at = np.maximum(k, 0)
            inside = np.clip(t - starts[at], 0, ends[at] - starts[at])
            return np.where(k >= 0, before[at] + inside, 0.0)

        return covered_until(self.ends) - covered_until(self.starts)

    def mean(self, values: np.ndarray, intervals: iv.Intervals, *, min_own_share: float = 0.0) -> float:
        """Time-weighted mean of ``values`` (one per sample) over a normalised interval set:
        each sample counts for the time it shares with the set. NaN where the samples
        cover none of it, or where less than ``min_own_share`` of the samples that touch
        the set is the set's own time (the set is too fragmented for samples this long:
        the mean would mostly be its neighbours')."""
        shared = self.overlaps(intervals)
        touching = (shared > 0) & np.isfinite(values)
        if not touching.any():
            return float("nan")
        own_share = shared[touching].sum() / (self.ends - self.starts)[touching].sum()
        if own_share < min_own_share:
            return float("nan")
        return float((values[touching] * shared[touching]).sum() / shared[touching].sum())

    def peak(self, values: np.ndarray, intervals: iv.Intervals) -> float:
        """Largest of ``values`` over the samples that overlap the set (NaN: none do)."""
        hits = (self.overlaps(intervals) > 0) & (values >= 0)
        return float(values[hits].max()) if hits.any() else float("nan")


def host_samples(f: Facts) -> HostSampleSeries | None:
    """The session's host samples (kind ``sample``), or None where it has none."""

    def compute() -> HostSampleSeries | None:
        ev = f.events
        rows = ev[(ev["kind"] == "sample").to_numpy()]
        if not len(rows):
            return None
        rows = rows.sort_values("start_ns", kind="stable")
        return HostSampleSeries(
            starts=rows["start_ns"].to_numpy(dtype=np.int64),
            ends=rows["end_ns"].to_numpy(dtype=np.int64),
            cores=rows["value"].to_numpy(dtype="float64"),
            system=rows["system_value"].to_numpy(dtype="float64"),
            rss=rows["bytes"].to_numpy(dtype="float64"),
        )

    return f.memo("host_samples", compute)


def logical_cores(f: Facts) -> float:
    """The host's logical cores as the collector recorded them (NaN: not recorded)."""
    for device in f.meta.devices:
        if device.kind == "cpu" and isinstance(device.properties.get("logical_cores"), int):
            return float(device.properties["logical_cores"])
    sampler = f.meta.trace_metadata.get("host_sampler") or {}
    cores = sampler.get("logical_cores") if isinstance(sampler, dict) else None
    return float(cores) if isinstance(cores, int) and cores > 0 else float("nan")


def _usable_cores(cpu: DeviceInfo | None) -> float:
    value = cpu.properties.get("usable_cores") if cpu is not None else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else float("nan")


@table(
    "device",
    title="Device Summary",
    description=(
        "One row per device. GPU busy time is the union of its kernels, copies and sets "
        "inside the window. The cpu row's busy time is traced: the union of framework operators "
        "and CUDA API calls on the host threads, so Python outside operators, a data loader's "
        "own work and sleeping are not counted. Its process_cpu and system_cpu columns are "
        "measured instead, by sampling the CPU time the process (with its worker processes) "
        "and the whole machine used every ~50 ms while the script ran; they are empty for "
        "sessions without host samples (traces from other profilers). Without a measured GPU "
        "there are no GPU rows and the cpu row's note says why."
    ),
    key='"cpu" or "gpu:N" (N the device ordinal)',
    columns={
        "name": "Device name as recorded.",
        "kind": "'cpu' or 'gpu'.",
        "busy_ns": "Union of the device's activity inside the window, ns. cpu: time inside operators and "
                   "CUDA API calls only (traced), not the CPU time used.",
        "kernel_busy_ns": "GPU: union of kernels alone inside the window, ns (copies and sets excluded).",
        "window_ns": "Length of the window, ns.",
        "utilization": "busy_ns / window_ns (0..1). cpu: the share of the window spent inside operators and "
                       "CUDA API calls; see process_cpu_utilization for the CPU actually used.",
        "kernel_utilization": "kernel_busy_ns / window_ns (0..1); the Paddle profiler's GPU utilisation.",
        "process_cpu_cores": "cpu: mean CPU use of the profiled process and its children (DataLoader workers) "
                             "over the window, in cores (1.0 = one core busy all the time), sampled.",
        "process_cpu_utilization": "cpu: process_cpu_cores / logical_cores (0..1).",
        "system_cpu_utilization": "cpu: mean CPU use of the whole machine over the window, all processes, as a "
                                  "share of all its logical cores (0..1), sampled.",
        "peak_rss_bytes": "cpu: largest resident set size of the profiled process sampled in the window, bytes "
                          "(its worker processes not added).",
        "logical_cores": "cpu: logical cores of the host, as recorded.",
        "usable_cores": "cpu: the cores the job may use, its CPU affinity and cgroup quota the fewer, as recorded "
                        "(NaN: not recorded, as in a trace from another profiler).",
        "sm_count": "Streaming multiprocessors, where known.",
        "compute_capability": "e.g. '8.0', where known.",
        "memory_bytes": "Device memory, where known (cpu: the host's physical memory).",
        "memory_bandwidth_gbps": "Peak memory bandwidth in GB/s, where known.",
        "cpu_features": "cpu: the flags that decide a dtype's matmul speed (avx2, fma, avx512f, avx512_bf16, "
                        "amx_bf16...), space-separated, as recorded ('' where not recorded).",
        "native_bf16": "cpu: whether the CPU runs bf16 matmuls natively (AVX512-BF16 or AMX; None: not recorded). "
                       "Without, torch converts and bf16 runs slower than fp32.",
        "native_fp16": "cpu: whether the CPU runs fp16 matmuls natively (AVX512-FP16 or AMX-FP16; None: not "
                       "recorded).",
        "bf16_vs_fp32": "cpu: bf16 matmul throughput over fp32 on this CPU, from a short one-thread probe after the "
                        "run (NaN: not probed); under 1, bf16 is the slower.",
        "autocast_ns_per_matrix_call": "cpu: what bf16 autocast's casts cost a matrix call beyond its arithmetic, "
                                       "forward and backward, from a probe of a tiny linear layer after the run, "
                                       "one thread, ns (NaN: not probed; probed where bf16 is the faster).",
        "fp32_matmul_flops": "cpu: fp32 matmul FLOP/s on one thread, from the same probe (NaN: not probed).",
        "torch_threads": "cpu: torch's operator threads (torch.get_num_threads()) as the script left them (NaN: not "
                         "recorded, as in a trace from another profiler).",
        "probe_threads": "cpu: where torch_threads outnumbered usable_cores, the thread count the probe set against "
                         "them: the usable cores (NaN: not probed).",
        "threads_speedup": "cpu: parallel adds and matmuls of a few sizes timed after the run at torch_threads over "
                           "at probe_threads, the geometric mean of their ratios, on the machine as loaded then (NaN: "
                           "not probed); over 1, fewer threads run them faster.",
        **{f"peak_{dtype}_flops_per_s": f"cpu: this CPU's {dtype} matmul FLOP/s as `advisor calibrate` measured it "
                                         "(NaN: not measured, or the calibration was not used)"
           for dtype in CALIBRATED_DTYPES},
        "note": "What was not measured, where something was not.",
    },
)
def device_table(f: Facts) -> pd.DataFrame:
    lo, hi = f.window
    rows: dict[str, dict] = {}
    infos = {d.id: d for d in f.meta.devices}
    cpu = next((d for d in f.meta.devices if d.kind == "cpu"), None)
    cpu_busy = f.busy(*HOST_BUSY_KINDS).length
    samples = host_samples(f)
    cores = logical_cores(f)
    window = iv.Intervals(np.asarray([lo], dtype=np.int64), np.asarray([hi], dtype=np.int64)) \
        if hi > lo else iv.EMPTY
    process_cores = samples.mean(samples.cores, window) if samples is not None else np.nan
    rows["cpu"] = {
        "name": cpu.name if cpu is not None and cpu.name else "host CPU",
        "kind": "cpu",
        "busy_ns": cpu_busy,
        "kernel_busy_ns": np.nan,
        "sm_count": np.nan,
        "compute_capability": None,
        "memory_bytes": cpu.total_memory_bytes if cpu is not None else None,
        "memory_bandwidth_gbps": cpu.memory_bandwidth_gbps if cpu is not None else None,
        "process_cpu_cores": process_cores,
        "process_cpu_utilization": process_cores / cores if cores > 0 else np.nan,
        "system_cpu_utilization": samples.mean(samples.system, window) if samples is not None else np.nan,
        "peak_rss_bytes": samples.peak(samples.rss, window) if samples is not None else np.nan,
        "logical_cores": cores,
        "usable_cores": _usable_cores(cpu),
        **_cpu_dtypes(cpu),
        **_threads(cpu),
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
    for column in ("sm_count", "memory_bytes", "memory_bandwidth_gbps", "process_cpu_cores", "process_cpu_utilization",
                   "system_cpu_utilization", "peak_rss_bytes", "logical_cores", "usable_cores",
                   "bf16_vs_fp32", "autocast_ns_per_matrix_call", "fp32_matmul_flops", "torch_threads", "probe_threads", "threads_speedup", *(f"peak_{dtype}_flops_per_s" for dtype in CALIBRATED_DTYPES)):
        out[column] = pd.to_numeric(out.get(column), errors="coerce")
    if not f.gpu_measured:
        with_notes(out, f.gpu_not_measured_note)
    return out


def _threads(cpu: DeviceInfo | None) -> dict:
    """torch's operator threads and the thread probe's figures, as the collector recorded them."""
    said = cpu.properties if cpu is not None else {}
    threads = said.get("torch_threads")
    out = {"torch_threads": float(threads) if isinstance(threads, int) and threads > 0 else np.nan,
           "probe_threads": np.nan, "threads_speedup": np.nan}
    probe = said.get("threads_probe")
    if isinstance(probe, dict) and isinstance(probe.get("cores"), int):
        ratios = [pair[0] / pair[1] for kind in ("add", "matmul") for pair in (probe.get(kind) or {}).values()
                  if isinstance(pair, (list, tuple)) and len(pair) == 2
                  and all(isinstance(t, (int, float)) and t > 0 for t in pair)]
        if ratios:
            out["probe_threads"] = float(probe["cores"])
            # The geometric mean: the probe's calls are of very different lengths.
            out["threads_speedup"] = float(np.exp(np.mean(np.log(ratios))))
    return out


def _cpu_dtypes(cpu: DeviceInfo | None) -> dict:
    """The CPU's dtype flags as the collector recorded them (None: a trace's CPU, unknown)."""
    features = CpuFeatures.from_dict((cpu.properties if cpu is not None else {}).get("cpu_features"))
    peaks = {f"peak_{dtype}_flops_per_s": float((cpu.peak_flops if cpu is not None else {}).get(dtype, np.nan))
             for dtype in CALIBRATED_DTYPES}
    probed = (cpu.properties if cpu is not None else {}).get("bf16_vs_fp32")
    peaks["bf16_vs_fp32"] = float(probed) if isinstance(probed, (int, float)) and probed > 0 else np.nan
    for name in ("autocast_ns_per_matrix_call", "fp32_matmul_flops"):
        figure = (cpu.properties if cpu is not None else {}).get(name)
        peaks[name] = float(figure) if isinstance(figure, (int, float)) and figure > 0 else np.nan
    if not features.known:
        return {"cpu_features": "", "native_bf16": None, "native_fp16": None, **peaks}
    return {"cpu_features": " ".join(sorted(features.flags)), "native_bf16": features.native_bf16,
            "native_fp16": features.native_fp16, **peaks}
