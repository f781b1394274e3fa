"""Can this machine collect? `advisor doctor` asks, one question a line.

    advisor       the install: version, the rules/ and knowledge/ data it ships, both valid
    torch         importable, which version, CPU or CUDA build
    host          the host collector: torch.profiler with CPU activities, psutil sampling
    driver        the NVIDIA kernel driver (/proc/driver/nvidia/version, else nvidia-smi)
    gpu           CUDA devices torch sees, and whether the knowledge base knows each one
    cupti-python  installed, loads libcupti, and of the CUDA major torch was built with
    cupti-free    CUPTI free for advisor: no tool injected into CUDA, and a collector
                  started and stopped in a fresh process
    calibration   this machine's CPU peaks measured (`advisor calibrate`), for CPU rooflines

Each check says ok, warn, fail or skip, and a skip says what could not be checked and
why (a CPU machine skips the GPU rows with the reason). Nothing here changes the
machine; the one program it runs (``cupti-start``) records nothing.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MachineCheck", "Verdict", "as_json", "check_machine", "driver_version", "render_machine", "verdict"]

STATUSES = ("ok", "warn", "fail", "skip")
# Variables through which a tool loads itself into every CUDA process (Nsight Systems,
# Nsight Compute and other CUPTI clients use the first); such a tool holds CUPTI.
INJECTION_VARIABLES = ("CUDA_INJECTION64_PATH", "CUDA_INJECTION32_PATH")
CHILD_TIMEOUT_S = 120


@dataclass
class MachineCheck:
    """One question about this machine and its answer."""

    name: str
    status: str  # ok, warn, fail, skip
    summary: str
    hint: str = ""  # what to do about it, where there is something to do
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verdict:
    """What the checks add up to, per kind of collection."""

    host: bool
    gpu: bool
    host_line: str
    gpu_line: str


def _one_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _check_install() -> MachineCheck:
    from advisor._version import __version__
    from advisor.errors import AdvisorError
    from advisor.knowledge import load_knowledge
    from advisor.paths import knowledge_dir, rules_dir

    where = Path(__file__).resolve().parent.parent
    try:
        rules, knowledge = rules_dir(), knowledge_dir()
        load_knowledge()
        from advisor.rules.packs.catalog import builtin_pack

        rules_count = len(builtin_pack().rules)
    except (AdvisorError, FileNotFoundError) as exc:
        return MachineCheck("advisor", "fail", f"advisor {__version__} at {where}: {_one_line(exc)}",
                            hint="reinstall advisor: its data folders are missing or damaged")
    return MachineCheck("advisor", "ok", f"advisor {__version__} at {where}; {rules_count} built-in rules, "
                                         f"knowledge base valid (Python {platform.python_version()})",
                        data={"version": __version__, "rules": str(rules), "knowledge": str(knowledge)})


def _check_torch(torch: Any, why: str | None) -> MachineCheck:
    if torch is None:
        return MachineCheck("torch", "warn", f"torch is not importable ({why}): scripts cannot be profiled; "
                                             "traces and saved sessions are still read",
                            hint="pip install torch (the build that fits this machine)")
    cuda = getattr(torch.version, "cuda", None)
    build = f"CUDA {cuda} build" if cuda else "CPU build"
    return MachineCheck("torch", "ok", f"torch {torch.__version__}, {build}",
                        data={"version": str(torch.__version__), "cuda": cuda})


def _check_host(torch: Any) -> MachineCheck:
    if torch is None:
        return MachineCheck("host", "skip", "not checked: the host collector needs torch")
    try:
        activities = {a.name for a in torch.profiler.supported_activities()}
    except Exception as exc:  # noqa: BLE001  (a broken profiler is the answer)
        return MachineCheck("host", "fail", f"torch.profiler is not usable: {_one_line(exc)}",
                            hint="reinstall torch")
    if "CPU" not in activities:
        return MachineCheck("host", "fail", f"torch.profiler records no CPU activity here ({sorted(activities)})",
                            hint="reinstall torch")
    try:
        import psutil

        sampling = f"psutil {psutil.__version__} samples CPU use and RSS"
    except ImportError:
        return MachineCheck("host", "warn", "torch.profiler records the host, but psutil is missing: no CPU or "
                                            "memory samples", hint="pip install psutil")
    return MachineCheck("host", "ok", f"torch.profiler records the host ({', '.join(sorted(activities))}); {sampling}")


PROC_DRIVER = Path("/proc/driver/nvidia/version")


def driver_version(proc: Path = PROC_DRIVER, smi: str | None = "nvidia-smi") -> tuple[str | None, str]:
    """The NVIDIA kernel driver's version and where it was read (``proc``, else the
    ``smi`` program found on PATH), or None and why not."""
    try:
        text = proc.read_text()
    except OSError:
        text = ""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    if match:
        return match[1], str(proc)
    smi = shutil.which(smi) if smi else None
    if smi:
        try:
            done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], check=False,
                                  capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"nvidia-smi did not answer ({_one_line(exc)})"
        version = _one_line(done.stdout)
        if done.returncode == 0 and version:
            return version, "nvidia-smi"
        return None, f"nvidia-smi failed: {_one_line(done.stderr or done.stdout) or f'exit {done.returncode}'}"
    return None, "no NVIDIA driver found (no /proc/driver/nvidia/version, no nvidia-smi)"


def _check_driver() -> MachineCheck:
    version, where = driver_version(PROC_DRIVER)
    if version is None:
        return MachineCheck("driver", "skip", where,
                            hint="the GPU is recorded only on a machine with an NVIDIA GPU and its driver")
    return MachineCheck("driver", "ok", f"NVIDIA driver {version} (from {where})", data={"version": version})


def _check_gpus(torch: Any) -> MachineCheck:
    if torch is None:
        return MachineCheck("gpu", "skip", "not checked: torch is not importable")
    if not getattr(torch.version, "cuda", None):
        return MachineCheck("gpu", "skip", f"not checked: torch {torch.__version__} is a CPU build, so it sees no GPU",
                            hint="on a GPU machine, install a CUDA build of torch")
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # noqa: BLE001
        return MachineCheck("gpu", "fail", f"CUDA does not initialise: {_one_line(exc)}",
                            hint="check the driver against torch's CUDA version (nvidia-smi)")
    if not count:
        return MachineCheck("gpu", "skip", f"no CUDA device is visible to torch (CUDA {torch.version.cuda}; "
                                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    from advisor.knowledge import match_device
    from advisor.session import DeviceInfo

    names, unknown = [], []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        capability = f"{props.major}.{props.minor}"
        names.append(f"{index}: {props.name} (sm {capability}, {props.multi_processor_count} SMs)")
        device = DeviceInfo(id=index, kind="gpu", name=props.name, compute_capability=capability,
                            sm_count=props.multi_processor_count, total_memory_bytes=props.total_memory)
        if match_device(device) is None:
            unknown.append(props.name)
    summary = "; ".join(names)
    if unknown:
        return MachineCheck("gpu", "warn", f"{summary}; not in the knowledge base: {', '.join(sorted(set(unknown)))}",
                            hint="rooflines need the GPU's peaks: use --gpu NAME with a close model, or add a "
                                 "profile to knowledge/gpus.yaml",
                            data={"devices": names})
    return MachineCheck("gpu", "ok", summary, data={"devices": names})


def _check_cupti(torch: Any, gpus: MachineCheck) -> MachineCheck:
    from advisor.collect import cupti

    version = cupti.cupti_python_version()
    if gpus.status not in ("ok", "warn"):
        installed = f"cupti-python {version} is installed" if version else "cupti-python is not installed"
        return MachineCheck("cupti-python", "skip", f"not loaded: there is no GPU for CUPTI to record ({installed})",
                            data={"version": version})
    api, why = cupti.import_cupti()
    if api is None:
        hint = cupti.install_hint(torch.version.cuda)
        return MachineCheck("cupti-python", "fail", f"{why}", hint=hint, data={"version": version})
    mismatch = cupti.version_mismatch(torch.version.cuda, version)
    if mismatch:
        return MachineCheck("cupti-python", "fail", mismatch, hint=cupti.install_hint(torch.version.cuda),
                            data={"version": version})
    return MachineCheck("cupti-python", "ok", f"cupti-python {version} loads CUPTI, for CUDA {torch.version.cuda}",
                        data={"version": version})


def _check_cupti_free(cupti_row: MachineCheck, *, run_child: bool) -> MachineCheck:
    injected = {name: os.environ[name] for name in INJECTION_VARIABLES if os.environ.get(name)}
    if cupti_row.status != "ok":
        return MachineCheck("cupti-free", "skip", "not checked: CUPTI was not loaded")
    if injected:
        where = ", ".join(f"{k}={v}" for k, v in injected.items())
        return MachineCheck("cupti-free", "fail", f"another tool is injected into CUDA ({where}) and holds CUPTI",
                            hint="run advisor outside that tool (for example not under nsys or ncu)",
                            data={"injected": injected})
    if not run_child:
        return MachineCheck("cupti-free", "skip", "not checked: starting the collector was not asked for",
                            data={"not_asked": True})
    from advisor.doctor.gpu_checks import MARK

    command = [sys.executable, "-m", "advisor.doctor.children", "cupti-start"]
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return MachineCheck("cupti-free", "fail", f"starting the collector took over {CHILD_TIMEOUT_S} s")
    reports = [json.loads(line[len(MARK):]) for line in done.stdout.splitlines() if line.startswith(MARK)]
    report = next((r for r in reports if r.get("what") == "cupti-start"), None)
    if report is None:
        tail = _one_line((done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"])
        return MachineCheck("cupti-free", "fail", f"the collector could not be started: exit {done.returncode}: {tail}")
    if not report["ok"]:
        return MachineCheck("cupti-free", "fail", f"the collector could not start: {report['error']}",
                            hint="another CUPTI client may hold it (a profiler, DCGM profiling); stop it and retry")
    notes = report.get("notes") or []
    return MachineCheck("cupti-free", "ok", "the collector started and stopped in a fresh process"
                                            + (f" ({'; '.join(notes)})" if notes else ""))


def _check_calibration() -> MachineCheck:
    from advisor.errors import AdvisorError
    from advisor.knowledge.calibrate import calibration_path, load_calibration

    try:
        calibration = load_calibration()
    except AdvisorError as exc:
        return MachineCheck("calibration", "warn", str(exc), hint="advisor calibrate")
    cpu = calibration.device("cpu") if calibration is not None else None
    if cpu is None or not cpu.matmul_flops:
        return MachineCheck("calibration", "warn", f"this machine's CPU peaks are not measured ({calibration_path()}): "
                                                   "CPU runs get no roofline", hint="advisor calibrate")
    best = max(cpu.matmul_flops.values())
    return MachineCheck("calibration", "ok", f"CPU peaks measured {cpu.measured}: up to {best / 1e9:.0f} GFLOP/s "
                                             f"({calibration_path()})")


def check_machine(*, start_collector: bool = True) -> list[MachineCheck]:
    """Every check, in order; ``start_collector`` starts and stops the CUPTI collector in
    a child process where everything before says it could run."""
    from advisor.collect.torch_hooks import import_torch

    torch, why = import_torch()
    rows = [_check_install(), _check_torch(torch, why), _check_host(torch), _check_driver()]
    gpus = _check_gpus(torch)
    rows.append(gpus)
    cupti_row = _check_cupti(torch, gpus)
    rows += [cupti_row, _check_cupti_free(cupti_row, run_child=start_collector), _check_calibration()]
    return rows


def verdict(rows: list[MachineCheck]) -> Verdict:
    """Whether scripts can be profiled on the host and on the GPU, each in one line."""
    by_name = {row.name: row for row in rows}
    host_ok = by_name["torch"].status == "ok" and by_name["host"].status in ("ok", "warn")
    gpu_rows = [by_name[n] for n in ("driver", "gpu", "cupti-python", "cupti-free")]
    unconfirmed = by_name["cupti-free"].data.get("not_asked", False)
    gpu_ok = all(row.status in ("ok", "warn") or (row.name == "cupti-free" and unconfirmed) for row in gpu_rows)
    if host_ok:
        host_line = "scripts are profiled on the host (torch.profiler, CPU activities); traces are read"
    else:
        first = next(r for r in (by_name["torch"], by_name["host"]) if r.status not in ("ok",))
        host_line = f"scripts cannot be profiled here ({first.summary}); traces are still read"
    if gpu_ok and unconfirmed:
        gpu_line = "the GPU can be recorded by the built-in CUPTI collector (not started here to confirm)"
    elif gpu_ok:
        gpu_line = "the GPU is recorded by the built-in CUPTI collector"
    else:
        first = next(r for r in gpu_rows if r.status not in ("ok", "warn"))
        gpu_line = f"the GPU is not recorded here: {first.summary}"
    return Verdict(host_ok, gpu_ok, host_line, gpu_line)


def render_machine(rows: list[MachineCheck]) -> str:
    """The checks and the verdict in words."""
    width = max(len(row.name) for row in rows)
    out = []
    for row in rows:
        out.append(f"[{row.status.upper():4}] {row.name.ljust(width)}  {row.summary}")
        if row.hint and row.status != "ok":
            out.append(f"       {' ' * width}  -> {row.hint}")
    result = verdict(rows)
    out += ["", f"Host: {result.host_line}.", f"GPU:  {result.gpu_line}."]
    return "\n".join(out)


def as_json(rows: list[MachineCheck]) -> dict[str, Any]:
    """The checks and the verdict as plain data (``advisor doctor --format json``)."""
    result = verdict(rows)
    return {"checks": [asdict(row) for row in rows], "can_collect": {"host": result.host, "gpu": result.gpu},
            "host": result.host_line, "gpu": result.gpu_line}
