"""The programs `advisor doctor` runs in child processes, one CUPTI user each.

    python -m advisor.doctor.children collect SESSION_DIR A:B SCRIPT [ARGS...]
        run SCRIPT under ``collect_script(gpu=True, steps=A:B)``, save the session, and
        print one JSON line saying which collector ran and how the script ended
    python -m advisor.doctor.children records OUT.json [--buffer-bytes N]
        a workload that makes every kind of activity record the collector reads, under a
        CuptiCollector started before CUDA initialises; OUT.json says which fields,
        copies, syncs, devices and clock readings arrived
    python -m advisor.doctor.children cupti-start
        start the CUPTI collector and stop it again, nothing else: whether CUPTI is free
        for advisor in a new process (no other tool holding it)

Each prints its JSON lines with advisor.doctor.gpu_checks.MARK in front.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from advisor.collect import cupti_records as rec  # imports no CUPTI
from advisor.doctor.gpu_checks import MARK, WORKLOAD_ELEMENTS

__all__ = ["child_collect", "child_cupti_start", "child_records", "field_report", "main", "note_record_types"]


def child_collect(argv: list[str]) -> int:
    session_dir, window, script, *args = argv
    from advisor.collect import collect_script
    from advisor.collect.steps import StepWindow

    run = collect_script(Path(script), args, gpu=True, steps=StepWindow.parse(window))
    run.session.save(session_dir)
    meta = run.session.meta
    print(MARK + json.dumps({"what": "collect", "exit_code": run.exit_code, "collector": meta.collector.name,
                             "gpu_measured": meta.collector.gpu_measured, "notes": meta.collector.notes}), flush=True)
    return 0


def _has(record: Any, dotted: str) -> bool:
    target = record
    try:
        for part in dotted.split("."):
            target = getattr(target, part)
    except AttributeError:
        return False
    return True


# Fields a kind shares with another in cupti_records.SPECS but has not itself: plain
# copies (CUpti_ActivityMemcpy6) carry no device pair, only peer-to-peer ones do.
ABSENT_BY_DESIGN = {rec.KIND_MEMCPY: ("src_device_id", "dst_device_id")}


def field_report(record: Any) -> tuple[str, dict[str, Any]] | None:
    """``KIND/ClassName`` of one activity record and which of the fields advisor copies
    out of its kind (advisor.collect.cupti_records.SPECS) it lacks, or has only under
    another name; None for a record without a readable kind."""
    try:
        kind = int(record.kind)
    except (AttributeError, TypeError, ValueError):  # the store counts these as unreadable
        return None
    missing: list[str] = []
    renamed: dict[str, str] = {}
    absent = []
    spec = rec.SPECS.get(kind)
    for name, candidates, _default in (spec.fields if spec else ()):
        found = next((c for c in candidates if _has(record, c)), None)
        if found is None and name in ABSENT_BY_DESIGN.get(kind, ()):
            absent.append(name)
        elif found is None:
            missing.append(name)
        elif found != name:
            renamed[name] = found
    key = f"{rec.KIND_NAMES.get(kind, kind)}/{type(record).__name__}"
    return key, {"count": 0, "missing": missing, "renamed": renamed, "absent_by_design": absent,
                 "known_kind": spec is not None}


def note_record_types(records: list[Any], types: dict[str, dict[str, Any]]) -> None:
    """Count ``records`` in ``types`` by ``KIND/ClassName``, checking the first record of
    each class for every field advisor reads (cupti-python has one class per record
    version, so one look per class is enough)."""
    for record in records:
        try:
            key = f"{rec.KIND_NAMES.get(int(record.kind), record.kind)}/{type(record).__name__}"
        except (AttributeError, TypeError, ValueError):
            continue
        entry = types.get(key)
        if entry is None:
            report = field_report(record)
            if report is None:
                continue
            entry = types[key] = report[1]
        entry["count"] += 1


def _memset(pointer: int, size: int) -> str | None:
    """cuMemsetD8 through the driver (torch fills with kernels, never a memset); None if
    done, else why not."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        result = driver.cuMemsetD8_v2(ctypes.c_uint64(pointer), ctypes.c_ubyte(0), ctypes.c_size_t(size))
    except (OSError, AttributeError) as exc:
        return str(exc)
    return None if result == 0 else f"cuMemsetD8_v2 returned {result}"


def child_records(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m advisor.doctor.children records")
    parser.add_argument("out", type=Path)
    parser.add_argument("--buffer-bytes", type=int, default=None)
    args = parser.parse_args(argv)
    import torch  # CUDA is not initialised by the import: the collector starts first

    from advisor.collect import cupti as cp

    api, why = cp.import_cupti()
    if api is None:
        args.out.write_text(json.dumps({"error": why}))
        return 2
    collector = cp.CuptiCollector(api, window=None, torch=torch)
    if args.buffer_bytes is not None:
        size = args.buffer_bytes
        collector._buffer_requested = lambda: (size, 0)  # no room: CUPTI has to drop
    types: dict[str, dict[str, Any]] = {}
    add_all = collector.store.add_all

    def inspecting(activities: Any) -> None:
        # Runs inside CUPTI's buffer callback, where the records are valid.
        records = list(activities)
        note_record_types(records, types)
        add_all(records)

    collector.store.add_all = inspecting
    try:
        collector.start()
    except Exception as exc:
        args.out.write_text(json.dumps({"error": f"the collector did not start: {exc}"}))
        return 2

    device = torch.device("cuda")
    host = torch.randn(WORKLOAD_ELEMENTS)
    on_device = host.to(device)  # pageable -> device
    pinned = host.pin_memory()
    also_on_device = pinned.to(device, non_blocking=True)  # pinned -> device, async
    square = torch.randn(512, 512, device=device)
    product = (square @ square).relu_()
    back = (on_device + also_on_device).cpu()  # device -> pageable
    pinned_back = torch.empty(WORKLOAD_ELEMENTS, pin_memory=True)
    pinned_back.copy_(on_device, non_blocking=True)  # device -> pinned, async
    memset_error = _memset(on_device.data_ptr(), on_device.numel() * 4)
    torch.cuda.current_stream().synchronize()  # Stream Sync
    event = torch.cuda.Event()
    event.record()
    event.synchronize()  # Event Sync
    side = torch.cuda.Stream()
    side.wait_event(event)  # Stream Wait Event
    with torch.cuda.stream(side):
        product.mul_(2)
    torch.cuda.nvtx.range_push("advisor-doctor.range")
    product.add_(1)
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.mark("advisor-doctor.mark")
    torch.cuda.synchronize()  # Context Sync
    del back

    capture = collector.stop()
    dropped = ctypes.c_size_t(0)
    try:
        api.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
        dropped_read = {"readable": True, "value": int(dropped.value)}
    except Exception as exc:
        dropped_read = {"readable": False, "error": f"{type(exc).__name__}: {exc}"}

    from advisor.session import text

    events = capture.events
    kind = text(events["kind"])
    names = text(events["name"])
    copies: dict[str, dict[str, Any]] = {}
    for index in np.flatnonzero(kind == "memcpy"):
        entry = copies.setdefault(names[index], {"bytes": [], "category": str(events["category"].iloc[index])})
        entry["bytes"].append(int(events["bytes"].iloc[index]))
    kernels = events[kind == "kernel"]
    kernel_names = text(kernels["name"])
    mangled = [n for n in kernel_names if n.startswith("_Z")]
    geometry_ok = (text(kernels["grid"]) != "") & (text(kernels["block"]) != "") & (kernels["registers"].to_numpy() > 0)
    markers = events[np.char.startswith(text(events["category"]).astype(str), "cupti:MARKER")]
    report = {
        "record_types": types,
        "memset_issued": memset_error is None,
        "memset_error": memset_error,
        "copies": copies,
        "syncs": sorted(set(names[kind == "sync"])),
        "kernels": {"count": len(kernels), "mangled": len(mangled), "mangled_example": mangled[:1],
                    "bad_geometry": int((~geometry_ok).sum()),
                    "with_op": float((kernels["parent_op"].to_numpy() >= 0).mean()) if len(kernels) else 0.0},
        "nvtx": {"rows": len(markers), "names": sorted(set(text(markers["name"]))),
                 "unpaired_note": next((n for n in capture.collector.notes if "NVTX" in n), "")},
        "devices": [d.model_dump() for d in capture.devices],
        "clock_offset_ns": capture.clock_offset_ns,
        "clock_error_ns": capture.clock_error_ns,
        "dropped_read": dropped_read,
        "collector_dropped": capture.collector.dropped_records,
        "enum_problems": rec.check_enums(api),
        "overhead_ns": capture.collector.overhead_ns,
        "notes": capture.collector.notes,
        "store": {"unreadable": collector.store.unreadable, "ignored": {str(k): v for k, v in collector.store.ignored.items()},
                  "callback_errors": collector.callback_errors},
    }
    args.out.write_text(json.dumps(report, indent=2, default=str))
    return 0


def child_cupti_start(argv: list[str]) -> int:
    """Start the CUPTI collector with no workload and stop it: prints whether that worked
    and, if not, CUPTI's own words (another subscriber, a missing library...)."""
    from advisor.collect import cupti as cp
    from advisor.collect.torch_hooks import import_torch

    torch, why = import_torch()
    if torch is None:
        print(MARK + json.dumps({"what": "cupti-start", "ok": False, "error": f"torch is not importable ({why})"}))
        return 2
    api, why = cp.import_cupti()
    if api is None:
        print(MARK + json.dumps({"what": "cupti-start", "ok": False, "error": why}))
        return 2
    collector = cp.CuptiCollector(api, window=None, torch=torch)
    try:
        collector.start()
        collector.stop()
    except Exception as exc:  # noqa: BLE001  (CUPTI's error is the answer)
        print(MARK + json.dumps({"what": "cupti-start", "ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(MARK + json.dumps({"what": "cupti-start", "ok": True, "notes": collector.notes}), flush=True)
    return 0


CHILDREN = {"collect": child_collect, "records": child_records, "cupti-start": child_cupti_start}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in CHILDREN:
        print(f"advisor doctor: a child needs one of {', '.join(CHILDREN)}", file=sys.stderr)
        return 2
    return CHILDREN[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
