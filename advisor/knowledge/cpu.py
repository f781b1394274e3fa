"""What a CPU can do with each dtype, from its feature flags, and whether a calibration's
peaks can be believed for this machine.

A CPU without AVX512-BF16 or AMX has no bf16 matmul of its own: torch converts, and bf16
autocast runs many times slower than fp32 there, while on a CPU with AMX the same autocast
is faster than fp32. So a dtype is good or bad advice only against the machine's flags
(``cpu_features``).

A calibration file (``advisor calibrate``) holds measured peaks; a file written on another
machine, or on this one while it was busy, would turn healthy ops into "far below the
roofline". ``judge_calibration`` says where the peaks come from (file, date, machine,
load) and refuses them where they were taken on another machine or are implausibly low
against what the CPU's vector units promise (``promised_fp32_flops``). Without a
calibration, ``probe_bf16_ratio`` measures in a few tens of milliseconds how bf16 matmuls
compare with fp32 ones on this CPU, which is all a dtype's advice needs.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CalibrationVerdict",
    "CpuFeatures",
    "cpu_features",
    "judge_calibration",
    "probe_autocast",
    "probe_autograd_node",
    "probe_bf16_ratio",
    "promised_fp32_flops",
]

# Flags that decide a dtype's matmul speed (as /proc/cpuinfo spells them).
KEPT_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16",
              "avx_vnni", "neon", "asimd", "sve", "bf16")
# A calibrated fp32 peak below this share of what the vector units promise was measured on
# a busy machine (or is otherwise wrong): advice sized from it would be wrong too.
PLAUSIBLE_SHARE = 0.05
# A calibration measured while other processes kept this many runnable threads a core or
# more measured a share of the machine, not its peaks (the load average counts the
# calibration's own threads too, at most one a core).
MAX_CALIBRATION_LOAD = 1.5
ASSUMED_GHZ = 2.0  # a conservative clock for the promise: most server cores run faster


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's dtype-relevant flags and what follows from them."""

    flags: frozenset[str] = field(default_factory=frozenset)
    known: bool = False  # False where the flags could not be read (then nothing is judged)

    @property
    def native_bf16(self) -> bool:
        """Whether matmuls run in bf16 natively (AVX512-BF16, AMX-BF16; Arm's BF16)."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16", "bf16"})

    @property
    def native_fp16(self) -> bool:
        return bool(self.flags & {"avx512_fp16", "amx_fp16"})

    @property
    def amx(self) -> bool:
        return bool(self.flags & {"amx_bf16", "amx_tile"})

    def describe(self) -> str:
        shown = [f for f in ("amx_bf16", "avx512_bf16", "avx512_fp16", "avx512f", "avx2", "fma") if f in self.flags]
        return ", ".join(shown) if shown else "no AVX2"

    def as_dict(self) -> dict[str, Any]:
        return {"flags": sorted(self.flags), "known": self.known}

    @classmethod
    def from_dict(cls, data: Any) -> CpuFeatures:
        if not isinstance(data, dict) or not data.get("known"):
            return cls()
        return cls(frozenset(str(f) for f in data.get("flags") or () if isinstance(f, str)), True)


def cpu_features(cpuinfo: str | Path = "/proc/cpuinfo") -> CpuFeatures:
    """This machine's CPU flags (Linux's /proc/cpuinfo; unknown elsewhere)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                head, _, rest = line.partition(":")
                if head.strip().lower() in ("flags", "features"):
                    flags = set(rest.split())
                    return CpuFeatures(frozenset(f for f in flags if f in KEPT_FLAGS), True)
    except OSError:
        pass
    return CpuFeatures()


def promised_fp32_flops(features: CpuFeatures, cores: float) -> float | None:
    """A floor of what the CPU's vector units do in fp32 matmul: FLOPs a cycle a core
    (AVX-512: 64, AVX2 with FMA: 32, AVX: 16, else 8) at ASSUMED_GHZ on ``cores``. None
    where the flags are unknown."""
    if not features.known or cores < 1:
        return None
    flags = features.flags
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16 if "avx" in flags else 8
    return per_cycle * ASSUMED_GHZ * 1e9 * cores


@dataclass(frozen=True)
class CalibrationVerdict:
    use: bool
    said: str  # one line: where the peaks come from, or why they are not used


def judge_calibration(path: Path, machine: dict[str, Any], measured: str, matmul_flops: dict[str, float],
                      *, features: CpuFeatures, cores: float, processor: str, torch_version: str = "",
                      this_torch: str = "") -> CalibrationVerdict:
    """Whether a calibration's CPU peaks hold for this run, and one line naming the file,
    the date, the machine and the load they were measured under: not from another machine,
    not under load (``MAX_CALIBRATION_LOAD``), not with another torch's kernels, and not
    implausibly low for this CPU's vector units."""
    when = measured.replace("T", " ").replace("+00:00", " UTC")
    load = machine.get("load_per_core")
    under = f", load {float(load):.1f} a core" if isinstance(load, (int, float)) else ""
    fp32 = matmul_flops.get("fp32")
    figures = ", ".join(f"{dtype} {value / 1e9:.3g} GFLOP/s" for dtype, value in sorted(matmul_flops.items()))
    theirs = str(machine.get("processor") or "")
    their_cores = machine.get("logical_cores")
    if (theirs and processor and theirs != processor) or (isinstance(their_cores, int) and their_cores != os.cpu_count()):
        return CalibrationVerdict(False, (
            f"CPU peaks in {path} not used: measured {when} on another machine ({theirs or '?'}, {their_cores} "
            f"logical cores; this is {processor or '?'}, {os.cpu_count()}); run `advisor calibrate` here"))
    again = "run `advisor calibrate` again when the machine is quiet"
    if isinstance(load, (int, float)) and load >= MAX_CALIBRATION_LOAD:
        return CalibrationVerdict(False, (
            f"CPU peaks in {path} not used: measured {when} under load {float(load):.1f} a core (other processes "
            f"held the cores, so {figures} is a share of this machine, not its peaks); {again}"))
    if torch_version and this_torch and _minor(torch_version) != _minor(this_torch):
        return CalibrationVerdict(False, (
            f"CPU peaks in {path} not used: measured {when} with torch {torch_version}, whose matmul kernels "
            f"this run's torch {this_torch} does not share; run `advisor calibrate` again"))
    promise = promised_fp32_flops(features, cores)
    if fp32 and promise and fp32 < PLAUSIBLE_SHARE * promise:
        return CalibrationVerdict(False, (
            f"CPU peaks in {path} not used: fp32 matmul measured at {fp32 / 1e9:.3g} GFLOP/s ({when}{under}), under "
            f"{PLAUSIBLE_SHARE:.0%} of the {promise / 1e9:.0f} GFLOP/s this CPU's {features.describe()} on {cores:g} "
            "cores promise: measured on a busy machine? run `advisor calibrate` again when it is quiet"))
    return CalibrationVerdict(True, f"CPU peaks from {path}, measured {when} on this machine{under}: {figures}")


def _minor(version: str) -> str:
    """'2.13' of '2.13.0+cpu'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def this_processor() -> str:
    """The processor's name as ``advisor calibrate`` records it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


PROBE_N = 256  # the probe's square matmul: large enough for the vector units, small enough to be quick
PROBE_SECONDS = 0.02  # per dtype


PROBE_TINY = 16  # the autocast probe's linear layer: all dispatch, no arithmetic to speak of
PROBE_CALLS = 200


def probe_autocast(torch: Any) -> dict[str, float] | None:
    """What bf16 autocast costs a matrix call on this CPU beyond its arithmetic, and fp32's
    matmul rate, one thread each, timed on the thread's CPU clock after the user's script:
    ``{"autocast_ns_per_matrix_call": ..., "fp32_matmul_flops": ...}``. A linear layer too
    small to have arithmetic runs forward and backward (three matrix calls) with autocast and
    without; the difference over the calls is the casts' and autocast's dispatch, which a
    matrix call pays whatever its size. None where torch cannot run it."""
    try:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            layer = torch.nn.Linear(PROBE_TINY, PROBE_TINY)
            x = torch.randn(PROBE_TINY, PROBE_TINY)
            spent = {}
            for amp in (False, True, False, True):
                start = time.thread_time()
                for _ in range(PROBE_CALLS):
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                        out = layer(x)
                    out.float().sum().backward()
                spent[amp] = min(spent.get(amp, float("inf")), time.thread_time() - start)
            a = torch.randn(PROBE_N, PROBE_N)
            a @ a
            runs, start = 0, time.thread_time()
            while True:
                a @ a
                runs += 1
                took = time.thread_time() - start
                if took >= PROBE_SECONDS or runs >= 10_000:
                    break
        finally:
            torch.set_num_threads(threads)
    except Exception:  # noqa: BLE001  (a probe that cannot run costs the figure, never the run)
        return None
    per_call = max(spent[True] - spent[False], 0.0) / (3 * PROBE_CALLS) * 1e9
    return {"autocast_ns_per_matrix_call": per_call, "fp32_matmul_flops": 2 * PROBE_N ** 3 * runs / max(took, 1e-9)}


def probe_bf16_ratio(torch: Any) -> float | None:
    """bf16 matmul throughput over fp32 on this CPU, one thread, timed on the thread's CPU
    clock (so a busy machine slows both alike): a few tens of milliseconds, after the
    user's script has ended, on tensors of its own. None where torch cannot run it."""
    try:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            rates = {}
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                a = torch.randn(PROBE_N, PROBE_N).to(dtype)
                b = torch.randn(PROBE_N, PROBE_N).to(dtype)
                a @ b  # first call: allocation, dispatch set-up
                runs, start = 0, time.thread_time()
                while True:
                    a @ b
                    runs += 1
                    spent = time.thread_time() - start
                    if spent >= PROBE_SECONDS or runs >= 10_000:
                        break
                rates[name] = runs / max(spent, 1e-9)
        finally:
            torch.set_num_threads(threads)
    except Exception:  # noqa: BLE001  (a probe that cannot run costs the figure, never the run)
        return None
    return rates["bf16"] / rates["fp32"] if rates.get("fp32") else None


# The autograd probe: blocks of the layers models are made of (a layer norm, a linear layer,
# GELU and a residual add: five autograd nodes a block, TBackward0 and AddmmBackward0 for
# the linear), small enough that the difference between grad mode and inference_mode is
# autograd's bookkeeping, run both ways. A chain of one kind of node (a multiplication)
# costs a third of what these do, and a model's nodes are these.
AUTOGRAD_WIDTH = 192
AUTOGRAD_BATCH = 16
AUTOGRAD_BLOCKS = 6
AUTOGRAD_NODES_PER_BLOCK = 5
AUTOGRAD_ROUNDS = 60
AUTOGRAD_REPEATS = 9


def probe_autograd_node(torch: Any) -> float | None:
    """What recording one autograd node costs a forward on this CPU, ns: creating the node,
    saving its inputs, the version counters and view tracking inference_mode skips. One
    thread, timed on the thread's CPU clock (a busy machine slows both sides alike), the
    least of alternated repeats, some tens of milliseconds after the user's script. None
    where torch cannot run it."""
    try:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            nn = torch.nn
            blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(AUTOGRAD_WIDTH), nn.Linear(AUTOGRAD_WIDTH, AUTOGRAD_WIDTH),
                                                 nn.GELU()) for _ in range(AUTOGRAD_BLOCKS)).eval()
            start = torch.randn(AUTOGRAD_BATCH, AUTOGRAD_WIDTH)

            def forward() -> None:
                h = start
                for block in blocks:
                    h = h + block(h)

            # Each repeat times both modes back to back; the median of their differences
            # (the least of each side separately may pair a quiet moment with a busy one).
            differences = []
            for repeat in range(AUTOGRAD_REPEATS + 1):
                spent = {}
                for grad in (True, False):
                    with torch.enable_grad() if grad else torch.inference_mode():
                        began = time.thread_time_ns()
                        for _ in range(AUTOGRAD_ROUNDS):
                            forward()
                        spent[grad] = time.thread_time_ns() - began
                if repeat:  # the first warms both modes
                    differences.append(spent[True] - spent[False])
        finally:
            torch.set_num_threads(threads)
    except Exception:  # noqa: BLE001  (a probe that cannot run costs the figure, never the run)
        return None
    nodes = AUTOGRAD_BLOCKS * AUTOGRAD_NODES_PER_BLOCK * AUTOGRAD_ROUNDS
    return max(sorted(differences)[len(differences) // 2], 0) / nodes
