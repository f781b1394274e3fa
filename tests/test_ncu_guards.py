"""The --ncu door's guards: regular files only, bounded, every figure checked, and a
kernel-name filter that never matches every kernel."""

from __future__ import annotations

import csv
import io
import os
import re

import pandas as pd
import pytest

from advisor.collect.ncu_run import _base, plan
from advisor.errors import TraceError
from advisor.importers import ncu
from advisor.importers.ncu import read_ncu

HEAD = ["ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed"]


def raw_page(path, rows, units=("", "", "", "", "usecond", "%")):
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(HEAD)
    writer.writerow(units)
    for row in rows:
        writer.writerow(row)
    path.write_text(out.getvalue())
    return path


def test_a_plain_page_is_read(tmp_path):
    [k] = read_ncu([raw_page(tmp_path / "raw.csv", [["0", "gemm", "(1, 1, 1)", "(128, 1, 1)", "351", "80"]])])
    assert k["duration_ns"] == pytest.approx(351_000) and k["sm_pct"] == 80


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="a Unix device file")
def test_a_device_is_refused_in_one_line():
    with pytest.raises(TraceError, match="not a regular file"):
        read_ncu([ncu.Path("/dev/zero")])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are a Unix thing")
def test_a_named_pipe_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "ncu.csv"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="not a regular file"):
        read_ncu([fifo])


def test_a_file_past_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "MAX_EXPORT_BYTES", 100)
    page = raw_page(tmp_path / "raw.csv", [["0", "gemm", "(1, 1, 1)", "(1, 1, 1)", "1", "1"]] * 10)
    with pytest.raises(TraceError, match="past the"):
        read_ncu([page])


def test_long_names_are_cut_and_long_ids_left_out_with_a_note(tmp_path):
    name = "k" * 200_000
    page = raw_page(tmp_path / "raw.csv", [["0", name, "(1, 1, 1)", "(1, 1, 1)", "1", "1"],
                                           ["9" * 5000, "other", "(1, 1, 1)", "(1, 1, 1)", "1", "1"]])
    notes: list[str] = []
    [k] = read_ncu([page], notes)
    assert len(k["kernel"]) == ncu.MAX_NAME_CHARS
    assert "cut" in notes[0] and "more than 18 digits" in notes[0]


def test_figures_that_cannot_be_right_are_refused_and_said(tmp_path):
    page = raw_page(tmp_path / "raw.csv", [["0", "a", "(1, 1, 1)", "(1, 1, 1)", "-351", "-300"],
                                           ["1", "b", "(1, 1, 1)", "(1, 1, 1)", "351", "250"],
                                           ["1", "b again", "(1, 1, 1)", "(1, 1, 1)", "1", "1"]])
    notes: list[str] = []
    a, b = read_ncu([page], notes)
    assert a["duration_ns"] is None and a["sm_pct"] is None
    assert b["kernel"] == "b" and b["sm_pct"] is None and b["duration_ns"] == pytest.approx(351_000)
    said = notes[0]
    assert "negative" in said and "over 100" in said and "given twice" in said


def test_a_duration_in_a_unit_not_known_is_refused(tmp_path):
    page = raw_page(tmp_path / "raw.csv", [["0", "a", "(1, 1, 1)", "(1, 1, 1)", "351", "50"]],
                    units=("", "", "", "", "fortnight", "%"))
    notes: list[str] = []
    [k] = read_ncu([page], notes)
    assert k["duration_ns"] is None and "fortnight" in notes[0]


def test_an_anonymous_namespace_kernel_makes_no_empty_alternative(tmp_path):
    name = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10>(float *, const float *, int)"
    assert _base(name) == "softmax_warp_forward"
    kernels = pd.DataFrame({"gpu_total_ns": [3.0, 2.0, 1.0], "calls": [5, 5, 5]},
                           index=[name, "void at::native::(anonymous namespace)::(anonymous namespace)::k<int>()",
                                  "(anonymous namespace)::<lambda()>"])
    the_plan = plan(kernels, "3", tmp_path / "train.py", [], tmp_path, steps=5, warmup_steps=1)
    pattern = the_plan.pattern
    assert pattern and "||" not in pattern and not pattern.startswith("|") and not pattern.endswith("|")
    assert the_plan.kernels == ("softmax_warp_forward", "k")
    assert not re.search(f"^(?:{pattern})$", "some_other_kernel")
