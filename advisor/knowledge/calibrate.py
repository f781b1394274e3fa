"""Measure this machine's peak matmul FLOP/s and memory bandwidth, and keep them.

The knowledge base holds datasheet peaks for GPUs, but nothing for the CPU a job ran on,
and a datasheet peak is not what a given machine reaches. ``advisor calibrate`` runs
``calibrate()`` and stores the result with ``save_calibration()``; a later run reads it
with ``load_calibration()`` so a CPU run gets a real roofline (and a GPU one a measured
ceiling beside the datasheet's).

What is measured, per device ("cpu", and "cuda:N" where torch.cuda.is_available()):

- matmul FLOP/s: ``torch.matmul`` on square n x n matrices of a few sizes, fp32 and, where
  the device supports it, bf16 (on a GPU also fp16 and TF32); FLOPs = 2 n^3; each size is
  run once to warm up (not counted), then repeated within its share of the time budget,
  and the best run counts. The largest size predicted not to fit the budget is skipped.
- memory bandwidth: a copy (``dst.copy_(src)``, 2 x bytes moved: read + write) and a
  triad (``dst = a + 3 b``, 3 x bytes) over arrays far larger than the caches, best run;
  the STREAM convention, so write-allocate traffic is not counted.

The JSON file (``advisor-calibration/1``) lives at $ADVISOR_CALIBRATION, else
$XDG_CONFIG_HOME/advisor/calibration.json, else ~/.config/advisor/calibration.json. Saving
merges by device, so calibrating the CPU keeps an earlier GPU entry and vice versa.
"""

from __future__ import annotations

import math
import os
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from advisor.errors import AdvisorError, UsageError
from advisor.knowledge.cpu import this_processor
from advisor.units import format_count

__all__ = [
    "CALIBRATION_FORMAT",
    "Calibration",
    "CalibrationError",
    "DeviceCalibration",
    "calibrate",
    "calibration_path",
    "format_calibration",
    "load_calibration",
    "save_calibration",
]

CALIBRATION_FORMAT = "advisor-calibration/1"
ENV_PATH = "ADVISOR_CALIBRATION"

CPU_SIZES = (256, 512, 1024, 2048)
GPU_SIZES = (1024, 2048, 4096, 8192)
CPU_ARRAY_BYTES = 128 * 2**20  # per array; three arrays for the triad
GPU_ARRAY_BYTES = 1024 * 2**20
MATMUL_SHARE = 0.65  # of the time budget; the rest goes to bandwidth
MAX_REPEATS = 50
SAMPLE_SECONDS = 0.002  # a timed sample batches small runs up to about this long


class CalibrationError(AdvisorError):
    """A calibration file that cannot be read, or a calibration that cannot run."""


class DeviceCalibration(BaseModel):
    """What one device measured (or why it was skipped)."""

    key: str = Field(description="'cpu' or 'cuda:N'.")
    kind: Literal["cpu", "gpu"]
    name: str = ""
    measured: str = Field(description="When, ISO 8601 UTC.")
    skipped: str | None = Field(default=None, description="Why nothing was measured, where nothing was.")
    torch_version: str = ""
    threads: int | None = Field(default=None, description="torch intra-op threads (CPU).")
    matmul_flops: dict[str, float] = Field(default_factory=dict, description="dtype -> best FLOP/s of torch.matmul.")
    matmul_size: dict[str, int] = Field(default_factory=dict, description="dtype -> n of the n x n matmul that reached it.")
    memory_bandwidth: float | None = Field(default=None, description="bytes/s: the better of copy and triad.")
    copy_bandwidth: float | None = Field(default=None, description="bytes/s, counting read + write.")
    triad_bandwidth: float | None = Field(default=None, description="bytes/s, counting two reads + one write.")
    array_bytes: int | None = Field(default=None, description="Size of each array in the bandwidth tests.")
    host_copy_gbps: dict[str, float] = Field(default_factory=dict, description="A GPU's copies to and from the host, "
                                             "GB/s: 'HtoD pinned', 'HtoD pageable', 'DtoH pinned', 'DtoH pageable'.")
    seconds: float = Field(default=0.0, description="Time the measurement took.")
    notes: list[str] = Field(default_factory=list)

    def peak_flops(self, dtype: str) -> float | None:
        """The measured matmul FLOP/s for ``dtype`` (fp32, bf16, fp16, tf32), or None."""
        from advisor.knowledge.hardware import normalize_dtype

        return self.matmul_flops.get(normalize_dtype(dtype) or str(dtype))


class Calibration(BaseModel):
    """Measured peaks of this machine's devices."""

    format: Literal["advisor-calibration/1"] = CALIBRATION_FORMAT
    machine: dict[str, Any] = Field(default_factory=dict, description="Host facts: processor, cores, OS, Python.")
    devices: list[DeviceCalibration] = Field(default_factory=list)

    def device(self, key: str = "cpu") -> DeviceCalibration | None:
        """The entry for ``key`` ('cpu', 'cuda:0'; 'cuda' means the first GPU) that was
        measured, or None."""
        for entry in self.devices:
            if entry.skipped is None and (entry.key == key or (key == "cuda" and entry.key.startswith("cuda"))):
                return entry
        return None


# -- where it is kept -----------------------------------------------------------------------


def calibration_path() -> Path:
    """$ADVISOR_CALIBRATION, else $XDG_CONFIG_HOME/advisor/calibration.json, else
    ~/.config/advisor/calibration.json."""
    explicit = os.environ.get(ENV_PATH, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip()
    base = Path(config).expanduser() if config else Path.home() / ".config"
    return base / "advisor" / "calibration.json"


def load_calibration(path: str | Path | None = None) -> Calibration | None:
    """The stored calibration, or None where there is none. A damaged file raises
    CalibrationError with one line (run ``advisor calibrate`` again to replace it)."""
    target = Path(path) if path is not None else calibration_path()
    if not target.is_file():
        return None
    try:
        return Calibration.model_validate_json(target.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationError(f"{target}: cannot be read ({exc.strerror or exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise CalibrationError(f"{target}: not an advisor calibration ({where + ': ' if where else ''}"
                               f"{first.get('msg', 'invalid')}); run `advisor calibrate` to replace it") from None


def save_calibration(calibration: Calibration, path: str | Path | None = None) -> Path:
    """Write ``calibration`` as JSON, merged with what the file already holds: an entry
    replaces the stored one for the same device, except that a skipped entry never
    replaces a measured one. A damaged file is replaced. Returns the path written."""
    target = Path(path) if path is not None else calibration_path()
    try:
        previous = load_calibration(target)
    except CalibrationError:
        previous = None
    merged: dict[str, DeviceCalibration] = {d.key: d for d in (previous.devices if previous else [])}
    for entry in calibration.devices:
        kept = merged.get(entry.key)
        if entry.skipped is not None and kept is not None and kept.skipped is None:
            continue
        merged[entry.key] = entry
    result = Calibration(machine=calibration.machine or (previous.machine if previous else {}),
                         devices=sorted(merged.values(), key=lambda d: (d.kind != "cpu", d.key)))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
        os.replace(partial, target)  # a reader never sees half a file
    except OSError as exc:
        raise CalibrationError(f"{target}: cannot be written ({exc.strerror or exc})") from None
    return target


# -- measuring ------------------------------------------------------------------------------------


def calibrate(device: str = "cpu", *, seconds: float = 8.0, sizes: Sequence[int] | None = None,
              array_bytes: int | None = None) -> Calibration:
    """Measure peak matmul FLOP/s and memory bandwidth of ``device``: "cpu", "cuda" (the
    current GPU), "cuda:N", or "all" (the CPU and every GPU). ``seconds`` is the budget
    per device (the CPU default stays under ~10 s on two cores); ``sizes`` the matmul
    sizes n and ``array_bytes`` the bandwidth arrays, for tests and small machines.
    A GPU that is not there is entered as skipped, with the reason."""
    if seconds <= 0:
        raise UsageError("calibrate: seconds must be positive")
    torch = _torch()
    keys = _device_keys(torch, device)
    machine = _machine()
    return Calibration(machine=machine, devices=[
        _calibrate_one(torch, key, seconds=seconds, sizes=sizes, array_bytes=array_bytes) for key in keys
    ])


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise CalibrationError("advisor calibrate needs PyTorch to run its matmuls: "
                               "install it (pip install 'advisor[torch]')") from None
    return torch


def _device_keys(torch: Any, device: str) -> list[str]:
    text = str(device).strip().lower()
    if text == "cpu":
        return ["cpu"]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text == "all":
        return ["cpu"] + ([f"cuda:{i}" for i in range(gpus)] or ["cuda"])
    if text == "cuda":
        return [f"cuda:{torch.cuda.current_device()}" if gpus else "cuda"]
    if text.startswith("cuda:") and text[5:].isdigit():
        return [text]
    raise UsageError(f"calibrate: unknown device {device!r}; use cpu, cuda, cuda:N or all")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _machine() -> dict[str, Any]:
    """Host facts kept with the peaks: which machine, and how busy it was when measured
    (a reader refuses peaks from another machine, and says the load beside them)."""
    cores = os.cpu_count() or 1
    try:
        load = round(os.getloadavg()[0] / cores, 2)
    except (AttributeError, OSError):  # no load average on this system
        load = None
    return {
        "processor": this_processor(),
        "logical_cores": os.cpu_count(),
        "system": f"{platform.system()} {platform.release()}".strip(),
        "python": platform.python_version(),
        "load_per_core": load,
    }


def _calibrate_one(torch: Any, key: str, *, seconds: float, sizes: Sequence[int] | None,
                   array_bytes: int | None) -> DeviceCalibration:
    started = time.perf_counter()
    if key == "cpu":
        entry = DeviceCalibration(key="cpu", kind="cpu", name=this_processor(), measured=_now(),
                                  torch_version=str(torch.__version__), threads=torch.get_num_threads())
        dtypes = [("fp32", torch.float32, None), ("bf16", torch.bfloat16, None)]
        _cpu_notes(torch, entry)
        run = _Runner(torch, torch.device("cpu"), sync=lambda: None)
        chosen_sizes = tuple(sizes or CPU_SIZES)
        nbytes = array_bytes or _cpu_array_bytes()
    else:
        if not torch.cuda.is_available():
            return DeviceCalibration(key=key, kind="gpu", measured=_now(), torch_version=str(torch.__version__),
                                     skipped="no CUDA device: torch.cuda.is_available() is False")
        index = int(key.split(":")[1]) if ":" in key else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            return DeviceCalibration(key=key, kind="gpu", measured=_now(), torch_version=str(torch.__version__),
                                     skipped=f"no CUDA device {index}: this machine has {torch.cuda.device_count()}")
        key = f"cuda:{index}"
        entry = DeviceCalibration(key=key, kind="gpu", name=torch.cuda.get_device_name(index), measured=_now(),
                                  torch_version=str(torch.__version__))
        major, _minor = torch.cuda.get_device_capability(index)
        dtypes = [("fp32", torch.float32, False)]
        if major >= 8:
            dtypes.append(("tf32", torch.float32, True))
        dtypes.append(("fp16", torch.float16, None))
        if torch.cuda.is_bf16_supported():
            dtypes.append(("bf16", torch.bfloat16, None))
        device = _torch_device(torch, key)
        run = _Runner(torch, device, sync=lambda: torch.cuda.synchronize(device))
        chosen_sizes = tuple(sizes or GPU_SIZES)
        free, _total = torch.cuda.mem_get_info(index)
        nbytes = array_bytes or int(min(GPU_ARRAY_BYTES, free // 6))

    matmul_budget = seconds * MATMUL_SHARE
    # fp32 is what most CPU jobs run; it gets the larger share.
    weights = [2.0 if name == "fp32" else 1.0 for name, _, _ in dtypes]
    for (name, dtype, tf32), weight in zip(dtypes, weights):
        budget = matmul_budget * weight / sum(weights)
        try:
            with _tf32(torch, tf32):
                flops, n, notes = run.matmul(dtype, chosen_sizes, budget)
        except RuntimeError as exc:  # a dtype the device's kernels do not cover
            entry.notes.append(f"{name} matmul not measured: {' '.join(str(exc).split())[:160]}")
            continue
        entry.notes.extend(f"{name}: {note}" for note in notes)
        if flops:
            entry.matmul_flops[name] = flops
            entry.matmul_size[name] = n

    copy, triad = run.bandwidth(nbytes, seconds * (1 - MATMUL_SHARE))
    entry.copy_bandwidth, entry.triad_bandwidth = copy, triad
    entry.memory_bandwidth = max(copy, triad)
    entry.array_bytes = nbytes
    if entry.kind == "gpu":
        try:
            entry.host_copy_gbps = _host_copies(torch, device, HOST_COPY_BYTES)
        except RuntimeError as exc:  # too little pinned memory, a device that refuses
            entry.notes.append(f"copies to and from the host not measured: {' '.join(str(exc).split())[:160]}")
        _compare_with_datasheet(entry)
    entry.seconds = round(time.perf_counter() - started, 3)
    return entry


HOST_COPY_BYTES = 64 << 20  # a copy this large runs at the link's rate, not its latency
HOST_COPY_REPEATS = 5


def _host_copies(torch: Any, device: Any, nbytes: int) -> dict[str, float]:
    """The best of a few copies of ``nbytes`` each way between the host and ``device``, from
    pinned and from pageable memory, GB/s (a pageable copy is staged by the driver through a
    pinned buffer: what pinning a loop's batches gives it is the difference)."""
    import time as clock

    out: dict[str, float] = {}
    on_device = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    for memory in ("pinned", "pageable"):
        host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=memory == "pinned")
        for direction, copy in (("HtoD", lambda: on_device.copy_(host, non_blocking=True)),
                                ("DtoH", lambda: host.copy_(on_device, non_blocking=True))):
            best = float("inf")
            for _ in range(HOST_COPY_REPEATS):
                torch.cuda.synchronize(device)
                began = clock.perf_counter()
                copy()
                torch.cuda.synchronize(device)
                best = min(best, clock.perf_counter() - began)
            out[f"{direction} {memory}"] = round(nbytes / best / 1e9, 2)
    return out


def _torch_device(torch: Any, key: str) -> Any:
    # One place that turns a key into a torch device, so a test can run the GPU
    # branch's bookkeeping on the CPU.
    return torch.device(key)


def _cpu_array_bytes() -> int:
    try:
        import psutil

        available = psutil.virtual_memory().available
    except (ImportError, OSError, RuntimeError):  # psutil missing or unreadable: keep the default
        return CPU_ARRAY_BYTES
    # Three arrays; leave most of the memory to everything else.
    return int(max(8 * 2**20, min(CPU_ARRAY_BYTES, available // 12)))


def _cpu_notes(torch: Any, entry: DeviceCalibration) -> None:
    cpu = getattr(torch, "cpu", None)
    probe = getattr(cpu, "_is_avx512_bf16_supported", None)
    amx = getattr(cpu, "_is_amx_tile_supported", None)
    try:
        native = bool(probe and probe()) or bool(amx and amx())
    except (AttributeError, RuntimeError):  # private torch helpers; failing only costs the note
        return
    if not native:
        entry.notes.append("bf16: this CPU has no native bf16 matmul (no AVX512-BF16 or AMX); "
                           "torch converts, so bf16 is usually slower than fp32 here")


class _tf32:
    """Set torch's TF32 switch for CUDA matmuls for the duration (None: leave it). Newer
    torch has ``fp32_precision`` and refuses reads of the legacy ``allow_tf32`` once the
    new one was set, so the new switch is used wherever it exists."""

    def __init__(self, torch: Any, allow: bool | None):
        self.torch, self.allow = torch, allow
        self.attribute: str | None = None
        self.saved: Any = None

    def __enter__(self) -> None:
        if self.allow is None:
            return
        matmul = self.torch.backends.cuda.matmul
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy switch warns on newer torch
            if hasattr(matmul, "fp32_precision"):
                self.attribute, value = "fp32_precision", "tf32" if self.allow else "ieee"
            else:
                self.attribute, value = "allow_tf32", self.allow
            self.saved = getattr(matmul, self.attribute)
            setattr(matmul, self.attribute, value)

    def __exit__(self, *exc: object) -> None:
        if self.attribute is None:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            setattr(self.torch.backends.cuda.matmul, self.attribute, self.saved)


class _Runner:
    """Timed runs on one device. ``sync`` waits for the device (a no-op on the CPU), so a
    wall-clock time around a batch of runs is the device's time."""

    def __init__(self, torch: Any, device: Any, sync: Callable[[], None]):
        self.torch, self.device, self.sync = torch, device, sync

    def _best(self, work: Callable[[], Any], budget: float, single: float) -> float:
        """Best seconds per call of ``work`` over repeats within ``budget``; calls are
        batched so that one timed sample lasts about SAMPLE_SECONDS."""
        batch = max(1, min(1000, int(SAMPLE_SECONDS / max(single, 1e-9))))
        best = math.inf
        deadline = time.perf_counter() + budget
        repeats = 0
        while repeats < 2 or (time.perf_counter() < deadline and repeats < MAX_REPEATS):
            self.sync()
            start = time.perf_counter()
            for _ in range(batch):
                work()
            self.sync()
            best = min(best, (time.perf_counter() - start) / batch)
            repeats += 1
        return best

    def matmul(self, dtype: Any, sizes: Sequence[int], budget: float) -> tuple[float, int, list[str]]:
        """Best FLOP/s over the sizes, the n that reached it, and notes on skipped sizes."""
        torch = self.torch
        best_flops, best_n, notes = 0.0, 0, []
        seconds_per_flop = None
        ordered = sorted({int(n) for n in sizes if int(n) > 0})
        spent_until = time.perf_counter() + budget
        for i, n in enumerate(ordered):
            remaining = spent_until - time.perf_counter()
            flops = 2.0 * n**3
            # Warm-up plus two timed runs must fit what is left.
            if seconds_per_flop is not None and seconds_per_flop * flops * 3 > remaining:
                notes.append(f"sizes from n={n} skipped: they would not fit the time budget")
                break
            a = torch.randn(n, n, device=self.device).to(dtype)
            b = torch.randn(n, n, device=self.device).to(dtype)
            out = torch.empty(n, n, device=self.device, dtype=dtype)
            self.sync()
            start = time.perf_counter()
            torch.matmul(a, b, out=out)  # warm-up: kernel selection, page faults; not counted
            self.sync()
            warm = time.perf_counter() - start
            share = max(0.0, spent_until - time.perf_counter()) / (len(ordered) - i)
            elapsed = self._best(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), share, warm)
            seconds_per_flop = elapsed / flops
            if flops / elapsed > best_flops:
                best_flops, best_n = flops / elapsed, n
        return best_flops, best_n, notes

    def bandwidth(self, nbytes: int, budget: float) -> tuple[float, float]:
        """Best copy and triad bandwidth in bytes/s over float32 arrays of ``nbytes``."""
        torch = self.torch
        count = max(1024, nbytes // 4)
        size = count * 4
        a = torch.ones(count, device=self.device)  # filled, so every page is really there
        b = torch.full((count,), 2.0, device=self.device)
        out = torch.zeros(count, device=self.device)
        self.sync()
        start = time.perf_counter()
        out.copy_(a)
        self.sync()
        single = time.perf_counter() - start
        copy = self._best(lambda: out.copy_(a), budget / 2, single)
        torch.add(a, b, alpha=3.0, out=out)
        triad = self._best(lambda: torch.add(a, b, alpha=3.0, out=out), budget / 2, single * 1.5)
        return 2 * size / copy, 3 * size / triad


def _compare_with_datasheet(entry: DeviceCalibration) -> None:
    """Note how the measured figures compare with the knowledge base's datasheet peaks."""
    from advisor.knowledge.hardware import gpu_profile, memory_bandwidth, peak_flops

    try:
        profile = gpu_profile(entry.name)
    except AdvisorError:
        entry.notes.append(f"{entry.name!r} is not in the knowledge base: no datasheet figures to compare with")
        return
    for name, measured in entry.matmul_flops.items():
        peak = peak_flops(profile, name, tensor_core=name != "fp32")
        if peak:
            entry.notes.append(f"{name}: {measured / peak:.0%} of the {profile.id} datasheet peak")
    if entry.memory_bandwidth:
        entry.notes.append(f"memory: {entry.memory_bandwidth / memory_bandwidth(profile):.0%} "
                           f"of the {profile.id} datasheet bandwidth")


# -- showing it --------------------------------------------------------------------------------------


def format_calibration(calibration: Calibration, path: Path | None = None) -> str:
    """A few lines for the terminal: one per device, then where it was stored."""
    lines = []
    for entry in calibration.devices:
        label = f"{entry.key} ({entry.name})" if entry.name else entry.key
        if entry.skipped:
            lines.append(f"{label}: skipped: {entry.skipped}")
            continue
        if entry.threads:
            label = label[:-1] + f", {entry.threads} threads)" if entry.name else f"{label} ({entry.threads} threads)"
        matmuls = ", ".join(f"{name} {format_count(flops)}FLOP/s (n={entry.matmul_size.get(name, 0)})"
                            for name, flops in entry.matmul_flops.items()) or "not measured"
        memory = (f"{format_count(entry.memory_bandwidth)}B/s (copy {format_count(entry.copy_bandwidth)}B/s, "
                  f"triad {format_count(entry.triad_bandwidth)}B/s)") if entry.memory_bandwidth else "not measured"
        lines.append(f"{label}: matmul {matmuls}; memory {memory}; {entry.seconds:.1f} s")
        lines.extend(f"  note: {note}" for note in entry.notes)
    if path is not None:
        lines.append(f"stored in {path}")
    return "\n".join(lines)
