"""Nothing read is lost without a word: every event the Kineto reader leaves out, repairs,
reads once of several copies or cannot tie to its launch is counted by cause and said in
the report's notes (and in profile-incomplete where the GPU's work is lost); a field of an
unexpected type costs that field a conversion, not the file the careful path; a rule that
fails, or a saving that is no number, is said and never takes the report down.

Synthetic traces are built here; the same cases on a real trace run where
../shared/traces holds it, and skip with the reason where it does not."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.importers.kineto import EventReader, open_trace
from advisor.importers.loader import load_kineto

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
BERT = "bert_small_infer_h100.json.gz"


def real_trace(name: str) -> dict:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"real trace {name} not available: {TRACES} is absent on this machine")
    return json.loads(gzip.decompress(path.read_bytes()))


def gpu_trace(steps: int = 6) -> list[dict]:
    """A small inference loop: per step a ProfilerStep range, an op that launches a kernel
    (cudaLaunchKernel, correlation id) and the kernel on the GPU's stream 7, and a copy."""
    events = []
    for n in range(steps):
        t = 1_000_000.0 + n * 1000.0
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 10, "tid": 10, "ts": t,
             "dur": 900.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 10, "ts": t + 10, "dur": 100.0,
             "args": {"External id": 100 + n, "Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10, "ts": t + 20,
             "dur": 10.0, "args": {"External id": 100 + n, "correlation": 1000 + n, "cbid": 211}},
            {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_64x64_nn", "pid": 0, "tid": 7, "ts": t + 40,
             "dur": 300.0, "args": {"External id": 100 + n, "device": 0, "stream": 7, "correlation": 1000 + n,
                                    "grid": [8, 1, 1], "block": [128, 1, 1]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 10, "tid": 10, "ts": t + 400,
             "dur": 10.0, "args": {"correlation": 2000 + n, "cbid": 41}},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7,
             "ts": t + 420, "dur": 20.0, "args": {"device": 0, "stream": 7, "correlation": 2000 + n,
                                                  "bytes": 1 << 20}},
        ]
    return events


def document(events: list[dict]) -> dict:
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8,
                                                      "computeMinor": 0, "numSms": 108}],
            "traceEvents": events}


def write(tmp_path: Path, doc: dict, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def notes_of(path: Path) -> list[str]:
    return list(load_kineto(path).meta.collector.notes)


def diagnose_json(path: Path, capsys, *extra: str) -> tuple[dict, list[str]]:
    """The JSON report of `advisor diagnose PATH` run here, and its stderr's lines."""
    code = main(["diagnose", str(path), "--format", "json", "--no-cache", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err and "internal error" not in err, err
    return json.loads(out), [line for line in err.splitlines() if line.strip()]


def without(event: dict, key: str) -> dict:
    return {k: v for k, v in event.items() if k != key}


def gpu_busy_ns(path: Path) -> int:
    events = load_kineto(path).events
    gpu = events[events["kind"].astype(str).isin(["kernel", "memcpy", "memset"])]
    return int((gpu["end_ns"] - gpu["start_ns"]).sum())


# -- item 3: events left out, repaired or not linked are said ------------------------------------


def test_kernels_without_a_category_are_recognised_read_and_said(tmp_path):
    whole = write(tmp_path, document(gpu_trace()), "whole.json")
    assert notes_of(whole) == []  # a whole trace says nothing
    events = [without(e, "cat") if e.get("cat") in ("kernel", "gpu_memcpy") else e for e in gpu_trace()]
    path = write(tmp_path, document(events))
    session = load_kineto(path)
    kinds = session.events["kind"].astype(str)
    assert (kinds == "kernel").sum() == 6 and (kinds == "memcpy").sum() == 6
    assert gpu_busy_ns(path) == gpu_busy_ns(whole)
    # Recognised by their device and stream, tied to their launches as before.
    assert (session.events.loc[kinds == "kernel", "launch"] >= 0).all()
    notes = session.meta.collector.notes
    assert any("repaired 12 events" in n and "without a category" in n for n in notes), notes


def test_a_host_event_without_a_category_is_left_out_and_said(tmp_path):
    events = [without(e, "cat") if e.get("name") == "aten::mm" else e for e in gpu_trace()]
    notes = notes_of(write(tmp_path, document(events)))
    assert any("left out 6 events" in n and "6 no category" in n for n in notes), notes


def test_an_unknown_category_is_named_in_the_note(tmp_path):
    events = gpu_trace() + [{"ph": "X", "cat": "my_profiler_counter", "name": "x", "pid": 10, "tid": 10,
                             "ts": 1_000_500.0, "dur": 1.0}]
    notes = notes_of(write(tmp_path, document(events)))
    assert any("left out 1 events" in n and "'my_profiler_counter'" in n for n in notes), notes


def test_gpu_work_that_cannot_be_recognised_makes_the_profile_incomplete(tmp_path, capsys):
    # Kernels without a category and without args: nothing says what they were, but they
    # sat on the GPU's own stream, so the GPU's work is missing from the profile.
    events = [without(without(e, "cat"), "args") if e.get("cat") == "kernel" else e for e in gpu_trace()]
    report, _ = diagnose_json(write(tmp_path, document(events)), capsys)
    assert report["findings"][0]["rule"] == "profile-incomplete"
    assert "6 GPU activity without a category" in report["findings"][0]["message"]
    assert any("skipped 6 damaged events" in n for n in report["notes"]), report["notes"]


@pytest.mark.parametrize(("ph", "said"), [("Z", "unknown phase"), (None, "no phase")])
def test_an_event_of_no_or_an_unknown_phase_is_counted_and_said(tmp_path, ph, said):
    events = gpu_trace()
    for event in events:
        if event.get("name") == "aten::mm":
            event.pop("ph")
            if ph is not None:
                event["ph"] = ph
    notes = notes_of(write(tmp_path, document(events)))
    assert any(f"6 {said}" in n for n in notes), notes


def test_a_kernel_of_an_unknown_phase_makes_the_profile_incomplete(tmp_path, capsys):
    events = [{**e, "ph": "Z"} if e.get("cat") == "kernel" else e for e in gpu_trace()]
    report, _ = diagnose_json(write(tmp_path, document(events)), capsys)
    assert report["findings"][0]["rule"] == "profile-incomplete"
    assert "GPU activity of an unknown phase" in report["findings"][0]["message"]


def test_gpu_work_tied_to_no_launch_is_said_by_cause(tmp_path):
    events = gpu_trace()
    kernels = [e for e in events if e.get("cat") == "kernel"]
    kernels[0]["args"]["correlation"] = 99_999  # no launch carries it
    del kernels[1]["args"]["correlation"]
    kernels[2].pop("args")  # and no args at all: no correlation either (device and stream from pid, tid)
    notes = notes_of(write(tmp_path, document(events)))
    assert any("3 GPU activities are tied to no launch" in n and "2 no correlation id" in n
               and "1 a correlation id no launch carries" in n for n in notes), notes


def test_real_trace_whose_kernels_lost_their_category_keeps_its_headline(tmp_path, capsys):
    doc = real_trace(BERT)
    whole = write(tmp_path, doc, "whole.json")
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel":
            del event["cat"]
    report, _ = diagnose_json(write(tmp_path, doc), capsys)
    original, _ = diagnose_json(whole, capsys)
    assert [(f["rule"], f["severity"]) for f in report["findings"]] == \
        [(f["rule"], f["severity"]) for f in original["findings"]]
    assert report["tables"]["device"] == original["tables"]["device"]  # GPU busy as recorded, not 0.1 %
    assert any("repaired 60 events" in n for n in report["notes"]), report["notes"]


# -- item 7: fields of the types real traces write take the fast path -----------------------------


def read_raw(path: Path) -> tuple[object, dict, EventReader]:
    stream = open_trace(path)
    try:
        reader = EventReader(stream, path, None)
        frame, meta, _ = reader.run()
    finally:
        stream.close()
    return frame, meta, reader


def test_text_streams_and_devices_and_hex_ids_read_on_the_fast_path(tmp_path):
    plain = read_raw(write(tmp_path, document(gpu_trace()), "plain.json"))
    events = gpu_trace()
    for event in events:
        args = event.get("args", {})
        for key in ("stream", "correlation"):
            if key in args:
                args[key] = hex(args[key])  # as ROCm writes a stream
        if "device" in args:
            args["device"] = str(args["device"])
        if "External id" in args:
            args["External id"] = str(args["External id"])
    frame, meta, reader = read_raw(write(tmp_path, document(events)))
    assert not reader.careful_used
    assert meta["_damage"]["repaired"] == {} and meta["_damage"]["skipped"] == {}
    assert frame.equals(plain[0])


def test_an_odd_field_in_every_event_costs_that_field_not_the_file(tmp_path):
    plain, _, _ = read_raw(write(tmp_path, document(gpu_trace()), "plain.json"))
    events = gpu_trace()
    for event in events:
        if event.get("cat") == "kernel":
            event["args"]["registers per thread"] = [32]  # a list where a number belongs
    frame, meta, reader = read_raw(write(tmp_path, document(events)))
    assert not reader.careful_used
    assert meta["_damage"]["repaired"] == {"wrong type": 6}
    assert frame.drop(columns="registers").equals(plain.drop(columns="registers"))
    assert (frame["registers"] == -1).all()


def test_text_that_is_no_number_is_absent_and_counted(tmp_path):
    events = gpu_trace()
    events[3]["args"]["stream"] = "default"
    frame, meta, reader = read_raw(write(tmp_path, document(events)))
    assert not reader.careful_used and meta["_damage"]["repaired"] == {"wrong type": 1}
    kernel = frame[frame["name"].astype(str) == "ampere_sgemm_64x64_nn"].iloc[0]
    assert kernel["stream"] == -1


def test_real_trace_with_hex_streams_reads_as_fast_and_the_same(tmp_path):
    doc = real_trace(BERT)
    plain, _, _ = read_raw(write(tmp_path, doc, "plain.json"))
    for event in doc["traceEvents"]:
        args = event.get("args")
        if isinstance(args, dict) and isinstance(args.get("stream"), int):
            args["stream"] = hex(args["stream"])
    frame, meta, reader = read_raw(write(tmp_path, doc))
    assert not reader.careful_used and meta["_damage"]["repaired"] == {}
    assert frame.equals(plain)


# -- item 8: copies read once, failures said, no number never a saving -----------------------------


def test_a_trace_written_twice_is_read_once_and_says_so(tmp_path):
    once = load_kineto(write(tmp_path, document(gpu_trace()), "once.json"))
    # Events alike but for an id are not copies: the same kernel launched again.
    alike = json.loads(json.dumps([e for e in gpu_trace() if e.get("cat") == "kernel"]))
    for event in alike:
        event["args"]["correlation"] += 50_000
    twice = load_kineto(write(tmp_path, document(gpu_trace() + gpu_trace() + alike)))
    assert len(twice.events) == len(once.events) + len(alike)
    notes = twice.meta.collector.notes
    assert any("36 events of the trace are copies of another" in n for n in notes), notes


def test_real_trace_written_twice_diagnoses_as_once(tmp_path, capsys):
    doc = real_trace(BERT)
    original, _ = diagnose_json(write(tmp_path, doc, "once.json"), capsys)
    doc["traceEvents"] = doc["traceEvents"] + json.loads(json.dumps(doc["traceEvents"]))
    report, err = diagnose_json(write(tmp_path, doc), capsys)
    assert not any("failed" in line for line in err), err
    assert [(f["rule"], f["severity"], f["saving"]["ms_per_step"]) for f in report["findings"]] == \
        [(f["rule"], f["severity"], f["saving"]["ms_per_step"]) for f in original["findings"]]
    assert any("are copies of another" in n for n in report["notes"]), report["notes"]


class _Context:
    run_step_ns = 1e6
    step_count = 4


@pytest.mark.parametrize("figure", [math.nan, math.inf, -math.inf])
def test_a_saving_that_is_no_number_is_refused_where_it_is_made(figure):
    from advisor.rules.savings import saving

    made = saving(_Context(), figure, "replayed", low_ns=figure, high_ns=figure)
    assert made.ms_per_step == 0 and made.share_of_step == 0
    assert made.low_ms_per_step is None and made.high_ms_per_step is None
    assert "not estimated" in made.basis


def test_bounds_that_are_no_number_are_left_out():
    from advisor.rules.savings import saving

    made = saving(_Context(), 2e5, "replayed", low_ns=math.nan, high_ns=3e5)
    assert (made.ms_per_step, made.low_ms_per_step, made.high_ms_per_step) == (0.2, None, 0.3)


def test_rules_whose_replay_gives_no_number_still_run(tmp_path, monkeypatch):
    """A step graph a profile made degenerate replays to NaN: the four rules that crashed
    on it (launch-bound, sync-memcpy-stall, below-roofline, tensor-core-misalignment) run."""
    from advisor.diagnosis import diagnose
    from advisor.rules.registry import RuleContext

    real_trace(BERT)
    session = load_kineto(TRACES / BERT)
    replay = RuleContext.what_if

    def no_number(self, fix, *, base=None):
        done = replay(self, fix, base=base)
        return None if done is None else type(done)(done.before_ns, math.nan, done.changed_ns, done.floor_bound)

    monkeypatch.setattr(RuleContext, "what_if", no_number)
    result = diagnose(session).result
    assert result.errors == []
    assert {"launch-bound", "tensor-core-misalignment"} <= {f.rule for f in result.findings}


def _broken(ctx):
    from advisor.findings import Saving

    Saving(ms_per_step=math.nan, share_of_step=math.nan)  # a pydantic error of several lines


@pytest.mark.parametrize("fmt", ["json", "markdown", "html", "terminal"])
def test_a_rule_that_fails_is_one_line_on_stderr_and_a_note_in_every_format(tmp_path, capsys, monkeypatch, fmt):
    from advisor.rules import registry

    monkeypatch.setattr(registry, "_CHECKS", {**registry.registered(), "launch-bound": _broken})
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / f"report.{fmt}"
    code = main(["diagnose", str(write(tmp_path, document(gpu_trace()))), "--format", fmt, "-o", str(out),
                 "--no-cache"])
    err = capsys.readouterr().err
    assert code == 0, err
    said = [line for line in err.splitlines() if "launch-bound" in line]
    assert len(said) == 1 and said[0].startswith("advisor: rule launch-bound failed and was skipped: "
                                                 "ValidationError"), err
    assert "Traceback" not in err and "For further information" not in err, err
    text = out.read_text()
    if fmt == "json":
        notes = json.loads(text)["notes"]
        assert any(n.startswith("Rule launch-bound failed and was skipped") and "ValidationError" in n
                   for n in notes), notes
    else:
        assert "launch-bound failed and was skipped" in " ".join(text.split()), text[-3000:]
