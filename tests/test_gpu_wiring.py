"""How the script runner hands the GPU side to the CUPTI collector: with a collector
standing in for CUPTI (none can run without a GPU), the hooks must report every step and
range to it, torch.profiler must stay off (Kineto would take CUPTI over), and the session
must come from the collector's capture."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest

from advisor.collect import collect_script, cupti
from advisor.collect.cupti import CuptiCapture
from advisor.session import CollectorInfo, DeviceInfo, conform_events

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,)))
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(data, batch_size=4):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(round(loss.item(), 3))
    """
)


class StandIn:
    """Records what the hooks tell a GPU collector, and hands back a small capture."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.open: dict[int, str] = {}
        self.next_token = 0
        self.profiler_seen: list[bool] = []

    def step_started(self, number):
        self.calls.append(("step_started", number))

    def step_ended(self, number, *, partial=False):
        self.calls.append(("step_ended", number, partial))

    def range_opened(self, name):
        self.next_token += 1
        self.open[self.next_token] = name
        self.calls.append(("opened", name))
        # torch.autograd.profiler reports whether any profiler is recording right now.
        self.profiler_seen.append(bool(torch.autograd.profiler._is_profiler_enabled))
        return self.next_token

    def range_closed(self, token):
        self.calls.append(("closed", self.open.pop(token)))

    def hand_over(self, where=""):
        self.calls.append(("hand_over", where))

    def stop(self, *, partial_steps=()):
        self.calls.append(("stop", tuple(partial_steps)))
        events = conform_events(pd.DataFrame({
            "name": ["ProfilerStep#0", "gemm"], "kind": ["step", "kernel"], "start_ns": [0, 10], "end_ns": [100, 60],
            "step": [0, 0], "device": [-1, 0],
        }))
        return CuptiCapture(events=events, devices=[DeviceInfo(id=0, kind="gpu", name="Stand-in GPU")],
                            collector=CollectorInfo(name="cupti", gpu_measured=True, dropped_records=3), base_time_ns=5)


@pytest.fixture
def stand_in(monkeypatch):
    listener = StandIn()
    monkeypatch.setattr(cupti, "start_collector", lambda torch, window=None, **kw: (listener, None))
    return listener


def test_hooks_report_steps_and_ranges_to_the_gpu_collector(tmp_path, stand_in):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = collect_script(script, [])
    assert run.exit_code == 0
    steps = [c for c in stand_in.calls if c[0].startswith("step_")]
    assert steps == [("step_started", 0), ("step_ended", 0, False), ("step_started", 1), ("step_ended", 1, False),
                     ("step_started", 2), ("step_ended", 2, False)]
    opened = [c[1] for c in stand_in.calls if c[0] == "opened"]
    assert opened.count("ProfilerStep#1") == 1
    for phase in ("advisor::Dataloader", "advisor::Forward", "advisor::Backward", "advisor::Optimization"):
        assert phase in opened
    assert any(name.startswith("advisor::sync item @ ") and str(script) in name for name in opened)
    assert not stand_in.open, "every range the collector heard open was closed"
    assert stand_in.calls[-1][0] == "stop"
    # torch.profiler never ran while the GPU collector held CUPTI.
    assert not any(stand_in.profiler_seen)


def test_the_session_comes_from_the_capture(tmp_path, stand_in):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    session = collect_script(script, []).session
    meta = session.meta
    assert meta.collector.name == "cupti" and meta.collector.gpu_measured
    assert meta.collector.dropped_records == 3
    assert [d.name for d in meta.devices if d.kind == "gpu"] == ["Stand-in GPU"]
    assert meta.base_time_ns == 5
    recorded = session.events[session.events["kind"] != "stack"]  # the Python stack samples come on top
    assert list(recorded["name"].astype(str)) == ["ProfilerStep#0", "gemm"]
    assert meta.trace_metadata["advisor"]["step_source"] == "dataloader"
    assert meta.trace_metadata["batch_size"] == 4


def test_without_cuda_the_host_collector_runs_and_says_why(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = collect_script(script, [], steps=None)
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU path is taken")
    meta = run.session.meta
    assert meta.collector.name == "host" and not meta.collector.gpu_measured
    gpu_notes = [n for n in meta.collector.notes if n.startswith("GPU not measured")]
    assert len(gpu_notes) == 1 and "advisor[cuda]" in gpu_notes[0]
    assert (run.session.events["kind"] == "step").sum() == 3


class _Device:
    def __init__(self, kind):
        self.type = kind


class _Tensor:
    def __init__(self, kind="cpu", pinned=False):
        self.device = _Device(kind)
        self._pinned = pinned

    def is_pinned(self):
        return self._pinned


def test_pageable_uploads_are_told_from_pinned_ones_and_read_backs():
    from advisor.collect.hooks.uploads import pageable_upload as _pageable_upload

    assert _pageable_upload((_Tensor(), "cuda:0"), {})
    assert _pageable_upload((_Tensor(), _Device("cuda")), {})
    assert _pageable_upload((_Tensor(),), {"device": "cuda"})
    assert not _pageable_upload((_Tensor(pinned=True), "cuda"), {})
    assert not _pageable_upload((_Tensor(), "cpu"), {})
    assert not _pageable_upload((_Tensor("cuda"), "cuda"), {})


class _UnaskedTensor(_Tensor):
    def is_pinned(self):
        raise AssertionError("is_pinned() asked while the GPU collector records")


def test_uploads_from_the_users_line_get_their_range_and_no_call_asks_is_pinned():
    """The upload wrapper (installed where torch sees a GPU), here around a stand-in
    ``Tensor.to`` while a collector with a listening GPU collector runs: every upload from
    the user's line gets a range naming the line (the copy record says whether it was
    pageable), none asks is_pinned(), and none is counted as a host-blocking call here."""
    import sys

    from advisor.collect import torch_hooks
    from advisor.collect.hooks.uploads import _wrap_upload

    calls = []
    upload = _wrap_upload(lambda *args, **kwargs: calls.append(args) or "copied", method="to")
    listener = StandIn()
    collector = torch_hooks.HostCollector(torch, profiler=False, listener=listener)
    collector.start()
    try:
        line = sys._getframe().f_lineno + 1
        assert upload(_UnaskedTensor(), "cuda") == "copied"
        upload(_UnaskedTensor(pinned=True), "cuda")
        upload(_UnaskedTensor(), "cpu")  # not an upload
    finally:
        result = collector.stop()
    assert len(calls) == 3
    opened = [c[1] for c in listener.calls if c[0] == "opened"]
    assert opened == [f"advisor::sync copy to device @ {__file__}({line}): "
                      "test_uploads_from_the_users_line_get_their_range_and_no_call_asks_is_pinned",
                      f"advisor::sync copy to device @ {__file__}({line + 1}): "
                      "test_uploads_from_the_users_line_get_their_range_and_no_call_asks_is_pinned"]
    assert result.host_syncs == []


def test_without_a_gpu_collector_a_pageable_upload_is_counted_and_a_pinned_one_is_not():
    """torch.profiler records (a GPU it cannot trace): is_pinned() tells the uploads apart."""
    import sys

    from advisor.collect import torch_hooks
    from advisor.collect.hooks.uploads import _wrap_upload

    upload = _wrap_upload(lambda *args, **kwargs: "copied", method="to")
    collector = torch_hooks.HostCollector(torch, profiler=True, window=None)
    collector.start()
    try:
        line = sys._getframe().f_lineno + 1
        upload(_Tensor(), "cuda")
        upload(_Tensor(pinned=True), "cuda")
    finally:
        result = collector.stop()
    [site] = result.host_syncs
    assert (site["call"], site["line"], site["calls"]) == ("pageable copy to device", line, 1)


def test_sync_ranges_with_spaces_in_the_call_name_still_give_their_line(tmp_path):
    from advisor.session.attribute import SYNC_RANGE

    match = SYNC_RANGE.match("advisor::sync pageable copy to device @ /w/train.py(12): main")
    assert (match["call"], match["frame"]) == ("pageable copy to device", "/w/train.py(12): main")
