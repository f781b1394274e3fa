"""Text from a trace never reaches a CSV reader as a command: control characters escaped,
and a cell a spreadsheet would run as a formula written as text (OWASP's CSV injection
advice); stderr lines escaped too."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from advisor.units import csv_cell

REPO = Path(__file__).resolve().parents[1]
OSC52 = "\x1b]52;c;ZWNobyBoaQ==\x07"


def test_a_cell_is_escaped_and_defused():
    assert csv_cell("=cmd|' /C calc'!A0") == "'=cmd|' /C calc'!A0"
    for start in ("+", "-", "@", "\t", "\r"):
        assert not csv_cell(f"{start}x").startswith(("=", "+", "-", "@", "\t", "\r"))
    assert csv_cell(f"k{OSC52}") == "k\\x1b]52;c;ZWNobyBoaQ==\\x07"
    assert csv_cell("void gemm<float>") == "void gemm<float>"


def _trace(path: Path) -> Path:
    events = []
    for step in range(4):
        base = step * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": base, "dur": 900})
        for k, name in enumerate(("=cmd|' /C calc'!A0", f"evil{OSC52}", "@SUM(A1)")):
            correlation = step * 10 + k + 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": base + 10 + 100 * k, "dur": 5, "args": {"correlation": correlation}})
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": base + 20 + 100 * k,
                           "dur": 50, "args": {"correlation": correlation, "device": 0, "stream": 7}})
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_summary_as_csv_holds_no_formula_and_no_escape_sequence(tmp_path):
    done = subprocess.run([sys.executable, "-m", "advisor", "summary", "--no-cache", str(_trace(tmp_path / "t.json")),
                           "--table", "kernel", "-f", "csv"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    body = done.stdout.split("\n", 1)[1]
    cells = [c for row in csv.reader(io.StringIO(body)) for c in row]
    assert not any(c.startswith(("=", "+", "@")) for c in cells), cells
    assert "'=cmd|' /C calc'!A0" in cells and "'@SUM(A1)" in cells
