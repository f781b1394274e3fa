"""torch's operator threads against the cores (the thread probe, the cpu_threads table and
the rule cpu-threads-oversubscribed): what fewer threads keep is read at each operator's
own length, nothing fires where the threads fit the cores, and the report says both."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from advisor.collect.cores import probe_threads
from advisor.reports._common import device_label
from advisor.rules import run_rules
from advisor.tables import compute_tables
from advisor.tables.cpu_threads import kept_shares
from tests.builders import Trace

# A probe as the collector writes it: seconds a call at 16 threads and at 2.
PROBE = {"threads": 16, "cores": 2,
         "add": {"65536": [0.0003, 0.00004], "4194304": [0.002, 0.0015]},
         "matmul": {"512": [0.003, 0.0018], "1024": [0.02, 0.016]}}


def test_an_operator_keeps_the_share_the_probe_calls_of_its_length_kept():
    at = np.array([0.0003, 0.002, 0.003, 0.02])
    saved = np.array([0.00026, 0.0005, 0.0012, 0.004])
    kept = kept_shares(np.array([0.0003e9, 0.003e9, 0.1e9, 0.0001e9]), (at, saved))
    assert kept[0] == pytest.approx(1 - 0.00026 / 0.0003)  # a probe point's own share
    assert kept[1] == pytest.approx(1 - 0.4)
    assert kept[2] == pytest.approx(1 - 0.2)  # longer than every probe call: the longest's share
    assert kept[3] == 1.0  # shorter than half the quickest probe call: it ran on one thread


def session(*, threads: int = 16, usable: float = 2, probe: dict | None = PROBE):
    """Four CPU steps of two 3 ms matrix products and a few short operators."""
    t = Trace()
    for number in range(1, 5):
        base = 10.0 * (number - 1)
        t.step(number, base, base + 10)
        t.phase("Forward", base, base + 4)
        linear = t.op("aten::linear", base + 0.1, base + 3.2)
        t.op("aten::addmm", base + 0.15, base + 3.15, parent=linear)
        t.op("aten::view", base + 3.3, base + 3.31)
        t.phase("Backward", base + 4, base + 9)
        t.op("aten::mm", base + 4.5, base + 7.5)
        t.op("aten::add_", base + 7.6, base + 7.9)
    s = t.session(gpu_measured=False)
    properties = {"torch_threads": threads, "usable_cores": usable}
    if probe is not None:
        properties["threads_probe"] = probe
    s.meta.devices[0].properties.update(properties)
    return s


def findings(s):
    return {f.rule: f for f in run_rules(s, compute_tables(s)).findings}


def test_more_threads_than_cores_is_named_with_the_probe_s_saving():
    s = session()
    table = compute_tables(s, ["cpu_threads"])["cpu_threads"]
    # Not linear (its addmm does the work); the view is too short to have gone parallel.
    assert set(table.index) == {"aten::addmm", "aten::mm", "aten::add_", "aten::view"}
    assert set(table.index[table["saved_ns_per_step"] > 0]) == {"aten::addmm", "aten::mm", "aten::add_"}
    assert table.at["aten::mm", "kept_share"] == pytest.approx(0.6)  # a 3 ms call, as the 512 matmul
    found = findings(s)["cpu-threads-oversubscribed"]
    assert "torch runs 16 operator threads on the 2 cores" in found.message
    assert "torch.set_num_threads(2)" in found.recommendation
    saved = float(table["saved_ns_per_step"].sum())
    assert found.saving.ms_per_step * 1e6 == pytest.approx(saved, rel=0.05)
    assert found.saving.low_ms_per_step < found.saving.ms_per_step < found.saving.high_ms_per_step


@pytest.mark.parametrize("made", [{"threads": 2, "probe": None}, {"probe": None}])
def test_threads_that_fit_the_cores_or_no_probe_is_no_finding(made):
    s = session(**made)
    assert compute_tables(s, ["cpu_threads"])["cpu_threads"].empty
    assert "cpu-threads-oversubscribed" not in findings(s)


def test_the_devices_line_says_the_threads_and_the_cores():
    cpu = session().meta.devices[0]
    assert "torch 16 threads on 2 usable cores" in device_label(cpu)


def test_the_probe_times_both_counts_and_leaves_the_setting_as_it_was():
    before = torch.get_num_threads()
    probed = probe_threads(torch, 2, 1)
    assert torch.get_num_threads() == before
    assert probed is not None and set(probed) == {"add", "matmul"}
    for pairs in probed.values():
        assert len(pairs) == 4 and all(len(pair) == 2 and min(pair) > 0 for pair in pairs.values())
