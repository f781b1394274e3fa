"""advisor verify: fixes resolved from a finding, applied in a trial, measured in pairs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from builders import REPO

from advisor.findings import Finding, Saving, Severity
from advisor.rules.packs.spec import VerifyFix
from advisor.verify import fixes
from advisor.verify.fixes import FixPlan, plan_fix
from advisor.verify.run import MAX_PAIRS, Trial, plan_trials, rank_by_measured, verify_findings


def _finding(rule: str, ms: float = 10.0, low: float | None = 8.0, high: float | None = 12.0, **metrics) -> Finding:
    return Finding(rule=rule, title=rule, severity=Severity.high, confidence=0.9,
                   saving=Saving(ms_per_step=ms, share_of_step=0.5, low_ms_per_step=low, high_ms_per_step=high),
                   message="", recommendation="", metrics=metrics)


def _spec(verify: list[dict], not_verifiable: str = "it needs an edit") -> types.SimpleNamespace:
    return types.SimpleNamespace(verify=[VerifyFix.model_validate(v) for v in verify], not_verifiable=not_verifiable,
                                 leads=False)


# -- a rule's declared fix, resolved against its finding -------------------------------------------


def test_a_fix_takes_the_findings_figures_and_the_first_that_resolves_wins():
    declared = [VerifyFix.model_validate({"apply": "batched_index", "requires": ["fix_batched_index"]}),
                VerifyFix.model_validate({"apply": "dataloader", "requires": ["fix_num_workers"],
                                          "with": {"num_workers": "{fix_num_workers}", "persistent_workers": True,
                                                   "torch_threads": "{torch_threads?}"}})]
    assert plan_fix(declared, {"fix_batched_index": True}) == FixPlan("batched_index", {})
    plan = plan_fix(declared, {"fix_num_workers": 3})
    assert plan == FixPlan("dataloader", {"num_workers": 3, "persistent_workers": True})  # the optional one left out
    assert plan_fix(declared, {"fix_num_workers": 3, "torch_threads": 1}).settings["torch_threads"] == 1
    assert plan_fix(declared, {}) is None
    missing = [VerifyFix.model_validate({"apply": "dataloader", "with": {"num_workers": "{absent}"}})]
    assert plan_fix(missing, {}) is None


def test_a_pack_can_only_name_advisors_own_fixes():
    with pytest.raises(ValueError, match="apply"):
        VerifyFix.model_validate({"apply": "os.system"})


def test_the_plan_says_why_a_finding_is_not_verified():
    specs = {
        "loader": _spec([{"apply": "dataloader", "with": {"num_workers": "{fix_num_workers}"}}]),
        "tf32": _spec([{"apply": "tf32"}], "padding is an edit"),
        "roofline": _spec([{"apply": "amp"}, {"apply": "compile"}], "the shapes are the model's"),
        "edit": _spec([], "bias=False is an edit of the model"),
    }
    findings = [_finding("loader", fix_num_workers=2), _finding("tf32"), _finding("roofline"), _finding("edit"),
                _finding("loader")]
    trials = plan_trials(findings, specs, gpu=False, tries=set(), max_fixes=4)
    assert len(trials) == 4  # --max-fixes
    assert trials[0].fix == FixPlan("dataloader", {"num_workers": 2})
    assert trials[1].fix is None and "needs a GPU" in trials[1].why_not
    assert trials[2].fix is None and "--try amp, --try compile" in trials[2].why_not
    assert trials[3].why_not == "not verifiable from outside the script: bias=False is an edit of the model"
    on_a_gpu = plan_trials(findings, specs, gpu=True, tries={"compile"}, max_fixes=5)
    assert on_a_gpu[1].fix == FixPlan("tf32", {})
    assert on_a_gpu[2].fix == FixPlan("compile", {})  # amp not asked for: the next declared fix
    assert on_a_gpu[4].fix is None  # a finding without the figure the fix needs


def test_every_builtin_fix_named_in_the_rules_exists_and_every_rule_says_something():
    from advisor.rules.packs.catalog import builtin_pack

    for spec in builtin_pack().rules:
        assert spec.verify or spec.not_verifiable, spec.id
        for entry in spec.verify:
            assert entry.apply in fixes.FIXES


# -- GPU fixes on a stand-in device -----------------------------------------------------------------


class _Switches:
    def __init__(self):
        self.allow_tf32 = False
        self.benchmark = False


def _stand_in_torch(gpu: bool):
    """What the GPU fixes touch, on a machine with or without a (stand-in) GPU."""
    torch = types.SimpleNamespace()
    torch.precision = None
    torch.set_float32_matmul_precision = lambda value: setattr(torch, "precision", value)
    torch.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=_Switches()), cudnn=_Switches())
    torch.cuda = types.SimpleNamespace(is_available=lambda: gpu)
    made = []

    class DataLoader:
        def __init__(self, dataset=None, batch_size=1, **kwargs):
            made.append(kwargs)

    torch.utils = types.SimpleNamespace(data=types.SimpleNamespace(DataLoader=DataLoader))
    torch.set_num_threads = lambda n: None
    return torch, made


def test_gpu_fixes_set_torchs_switches_on_a_stand_in_gpu():
    torch, made = _stand_in_torch(gpu=True)
    fixes.apply_fixes(torch, [{"name": "tf32"}, {"name": "cudnn_benchmark"},
                              {"name": "dataloader", "settings": {"pin_memory": True}}])
    assert torch.precision == "high"
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.backends.cudnn.benchmark
    torch.utils.data.DataLoader([1, 2], batch_size=2)
    assert made[-1]["pin_memory"] is True
    # Without a GPU there is nothing to pin for: the loader is made as the script made it.
    cpu, made_here = _stand_in_torch(gpu=False)
    fixes.apply_fixes(cpu, [{"name": "dataloader", "settings": {"pin_memory": True}}])
    cpu.utils.data.DataLoader([1, 2], batch_size=2)
    assert "pin_memory" not in made_here[-1]


# -- the fixes in a real trial ------------------------------------------------------------------------

torch = pytest.importorskip("torch")

_PROBE = textwrap.dedent("""
    import json, sys, torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    data = TensorDataset(torch.arange(24.).reshape(12, 2), torch.arange(12))
    loader = DataLoader(data, 4)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = []
    for x, y in loader:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        batches.append([x.tolist(), y.tolist()])
    try:
        autocast = torch.is_autocast_enabled("cpu")
    except TypeError:  # torch before 2.4
        autocast = torch.is_autocast_cpu_enabled()
    json.dump({"autocast": autocast, "workers": loader.num_workers, "persistent": loader.persistent_workers,
               "dataset": type(loader.dataset).__name__, "foreach": opt.defaults.get("foreach"),
               "fused": opt.defaults.get("fused"),
               "grad": model.weight.grad is None, "batches": batches, "threads": torch.get_num_threads()},
              open(sys.argv[1], "w"))
""")


def _trial(tmp_path: Path, fixes_data: list[dict], *, source: str = "dataloader", steps: int = 50) -> tuple[dict, dict]:
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    seen, out = tmp_path / "seen.json", tmp_path / "out.json"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"script": str(script), "args": [str(seen)], "fixes": fixes_data, "step_source": source,
                                "warmup": 0, "steps": steps, "out": str(out)}))
    done = subprocess.run([sys.executable, "-m", "advisor.verify.trial", str(plan)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(seen.read_text()) if seen.is_file() else {}, json.loads(out.read_text())


def test_a_trial_without_a_fix_runs_the_script_as_written_and_times_its_steps(tmp_path):
    seen, out = _trial(tmp_path, [])
    assert seen["workers"] == 0 and seen["grad"] is False and len(seen["batches"]) == 3
    assert out["ended"] == "ended" and len(out["durations_ns"]) == 3  # the read that runs out ends the third


def test_the_fixes_reach_what_the_script_makes(tmp_path):
    plain, _ = _trial(tmp_path, [])
    seen, _ = _trial(tmp_path, [{"name": "dataloader", "settings": {"num_workers": 2, "persistent_workers": True,
                                                                    "torch_threads": 1}},
                                {"name": "optimizer", "settings": {"foreach": True}},
                                {"name": "zero_grad_set_to_none"}])
    assert seen["workers"] == 2 and seen["threads"] == 1 and seen["persistent"] is True
    assert seen["foreach"] is True and seen["grad"] is True
    assert seen["batches"] == plain["batches"]  # the same data, made elsewhere
    assert plain["autocast"] is False
    assert _trial(tmp_path, [{"name": "amp"}])[0]["autocast"] is True  # --try amp: the whole script autocast
    batched, out = _trial(tmp_path, [{"name": "batched_index"}])
    assert plain["dataset"] == "TensorDataset" and batched["dataset"] == "BatchedTensors"
    assert batched["batches"] == plain["batches"]  # indexed a batch at a time, the same batches
    assert out["changes"] == {"batched_index": 1}


def test_the_optimizer_finding_s_fix_is_foreach_on_a_gpu_and_fused_on_a_cpu(tmp_path):
    from advisor.rules import builtin_specs

    declared = next(s for s in builtin_specs() if s.id == "optimizer-not-fused").verify
    assert plan_fix(declared, {"fix_foreach": 1.0}) == FixPlan("optimizer", {"foreach": 1.0})
    cpu = plan_fix(declared, {"fix_foreach": 0.0, "fix_fused": 1.0})
    assert cpu == FixPlan("optimizer", {"foreach": 0.0, "fused": 1.0})
    assert cpu.describe() == "optimizer foreach=False, fused=True"  # switches, not the finding's figures
    # In the trial, the probe's SGD is built fused (torch refuses foreach and fused together).
    seen, out = _trial(tmp_path, [{"name": "optimizer", "settings": cpu.settings}])
    assert seen["fused"] is True and seen["foreach"] is False and out["changes"]["optimizer"] == 1


def test_each_fix_counts_what_it_changed_and_one_that_found_nothing_counts_none(tmp_path):
    _, out = _trial(tmp_path, [{"name": "dataloader", "settings": {"num_workers": 2}},
                               {"name": "optimizer", "settings": {"foreach": True}},
                               {"name": "zero_grad_set_to_none"}])
    assert out["changes"]["dataloader"] == 1 and out["changes"]["optimizer"] == 1
    assert out["changes"]["zero_grad_set_to_none"] == 3  # the probe's three zero_grad(set_to_none=False)
    # The script's own settings asked again: nothing changes.
    assert _trial(tmp_path, [{"name": "dataloader", "settings": {"num_workers": 0}}])[1]["changes"] == {"dataloader": 0}
    # A Dataset of the script's own, with its own collate_fn: a batched index has nothing to replace.
    script = tmp_path / "own.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Rows(Dataset):
            def __len__(self): return 12
            def __getitem__(self, i): return [i, i + 1]
        for batch in DataLoader(Rows(), 4, collate_fn=lambda rows: torch.tensor(rows)):
            batch.sum()
    """))
    out_file, plan = tmp_path / "own_out.json", tmp_path / "own_plan.json"
    plan.write_text(json.dumps({"script": str(script), "args": [], "fixes": [{"name": "batched_index"}],
                                "step_source": "dataloader", "warmup": 0, "steps": 2, "out": str(out_file)}))
    subprocess.run([sys.executable, "-m", "advisor.verify.trial", str(plan)], check=True, timeout=120, cwd=REPO)
    assert json.loads(out_file.read_text())["changes"] == {"batched_index": 0}


def test_a_trial_stops_the_script_once_its_steps_are_timed(tmp_path):
    seen, out = _trial(tmp_path, [], steps=1)
    assert seen == {} and out["ended"] == "stopped" and len(out["durations_ns"]) == 1


# -- pairs of runs ------------------------------------------------------------------------------------


def _runner(before_ms: float, after_ms: float, noise: list[float]):
    calls = []

    def run(plan, timeout_s):
        calls.append([f["name"] for f in plan["fixes"]])
        wobble = noise[len(calls) % len(noise)]
        base = after_ms if plan["fixes"] else before_ms
        return {"durations_ns": [int((base + wobble) * 1e6)] * 3, "ended": "stopped"}

    return run, calls


def test_runs_alternate_and_stop_once_the_difference_is_clear():
    finding = _finding("loader", ms=10.0, low=8.0, high=12.0)
    trial = Trial(0, "loader", FixPlan("dataloader", {"num_workers": 1}))
    run, calls = _runner(20.0, 10.5, [0.0, 0.3, -0.2, 0.1])
    [out] = verify_findings([finding], [trial], script="x.py", args=[], step_source="dataloader", warmup=1,
                            steps=3, budget_s=600, say=lambda line: None, run=run)
    v = out.verification
    assert v is not None and v.clear_of_noise and 2 <= v.trials < MAX_PAIRS
    assert calls[:4] == [[], ["dataloader"], ["dataloader"], []]  # each pair's order alternates
    assert v.measured_saving_ms_per_step == pytest.approx(9.5, abs=0.5) and v.inside_range
    assert v.before_ms_per_step > v.after_ms_per_step and v.steps_timed == 3


def test_a_saving_lost_in_the_noise_runs_to_the_budget_and_says_so():
    finding = _finding("loader", ms=10.0)
    trial = Trial(0, "loader", FixPlan("dataloader", {"num_workers": 1}))
    run, calls = _runner(20.0, 20.0, [0.0, 3.0, -3.0, 1.0, -1.0])
    [out] = verify_findings([finding], [trial], script="x.py", args=[], step_source=None, warmup=0, steps=3,
                            budget_s=600, say=lambda line: None, run=run)
    v = out.verification
    assert not v.clear_of_noise and v.trials == MAX_PAIRS and not v.inside_range


def test_a_trial_that_fails_is_the_findings_reason_and_the_ranking_follows_what_was_measured():
    findings = [_finding(r, ms=ms, low=None, high=None) for r, ms in (("a", 30.0), ("b", 20.0), ("c", 25.0))]
    trials = [Trial(0, "a", FixPlan("optimizer", {"foreach": True})), Trial(1, "b", FixPlan("zero_grad_set_to_none")),
              Trial(2, "c", None, "not verifiable from outside the script: an edit")]

    def run(plan, timeout_s):
        names = [f["name"] for f in plan["fixes"]]
        if names == ["optimizer"]:
            return {"durations_ns": [], "error": "the script failed: ValueError: bad"}
        return {"durations_ns": [int(45e6 if not names else 10e6)] * 2}

    out = verify_findings(findings, trials, script="x.py", args=[], step_source=None, warmup=0, steps=2,
                          budget_s=600, say=lambda line: None, run=run)
    assert "ValueError: bad" in out[0].not_verified.reason
    assert out[1].verification.measured_saving_ms_per_step == pytest.approx(35.0)
    assert out[2].not_verified.reason.endswith("an edit")
    assert [f.rule for f in rank_by_measured(out, set())] == ["b", "a", "c"]  # 35 measured, 30 and 25 predicted


def test_a_fix_that_changed_nothing_is_not_compared_and_says_what_it_applies_to():
    finding = _finding("loader", ms=35.0, low=17.0, high=36.0)
    trial = Trial(0, "loader", FixPlan("batched_index"))
    calls = []

    def run(plan, timeout_s):
        calls.append([f["name"] for f in plan["fixes"]])
        return {"durations_ns": [int(50e6)] * 3, "changes": {f["name"]: 0 for f in plan["fixes"]}}

    [out] = verify_findings([finding], [trial], script="x.py", args=[], step_source="dataloader", warmup=0, steps=3,
                            budget_s=600, say=lambda line: None, run=run)
    assert out.verification is None and calls == [[], ["batched_index"]]  # no further pair
    assert "changed nothing in this script" in out.not_verified.reason
    assert "TensorDataset" in out.not_verified.reason


# -- the command ----------------------------------------------------------------------------------------


def test_verify_needs_a_script_and_says_so_in_one_line(tmp_path, make_trace):
    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    done = subprocess.run([sys.executable, "-m", "advisor", "verify", str(trace)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "verify reruns a script" in done.stderr


@pytest.mark.slow
def test_verify_measures_the_starved_loaders_fix_inside_its_range(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "advisor", "verify", "--budget", "120", "--format", "json", "-o",
                           str(out), str(REPO / "examples" / "starved_loader.py"), "--steps", "40"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "verify now runs the script again" in done.stderr and done.stderr.count("runs the script again") == 1
    report = json.loads(out.read_text())
    import jsonschema

    from advisor.reports.schema import load_report_schema

    jsonschema.validate(report, load_report_schema())
    top = report["findings"][0]
    assert top["rule"] == "dataloader-starvation"
    v = top["verification"]
    assert v["applied"].startswith("DataLoader num_workers=")
    assert v["measured_saving_ms_per_step"] > 0.5 * top["saving"]["ms_per_step"]
    assert v["before_ms_per_step"] > v["after_ms_per_step"] and v["trials"] >= 2


def test_a_dry_run_lists_the_trials_and_runs_none(tmp_path):
    done = subprocess.run([sys.executable, "-m", "advisor", "verify", "--dry-run",
                           str(REPO / "examples" / "starved_loader.py"), "--steps", "8"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "advisor verify would run" in done.stdout and "dataloader-starvation: DataLoader num_workers=" in done.stdout
    assert "side effects" not in done.stderr
    # 8 steps cannot give a trial its 2 warm-up and 20 timed steps: said before any trial,
    # with the script's own option to change.
    assert "the script ran 8 steps, so a trial times 6 of the 20 asked" in done.stderr
    assert "(--steps 22 or more, it has --steps 8)" in done.stderr


def test_the_budget_covers_the_diagnosis_too(tmp_path):
    """A budget the diagnosis's own run of the script spends leaves no trial to run: said,
    and each finding says why it was not measured."""
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "advisor", "verify", "--budget", "1", "--format", "json", "-o",
                           str(out), str(REPO / "examples" / "starved_loader.py"), "--steps", "8"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "budget of 1 s was spent by the diagnosis: no trial runs" in done.stderr
    assert "runs the script again" not in done.stderr
    top = json.loads(out.read_text())["findings"][0]
    assert top["verification"] is None and "spent verify's whole budget" in top["not_verified"]["reason"]


def test_diagnose_verify_is_the_same_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "advisor", "diagnose", "--verify", "--dry-run", "--max-fixes", "1",
                           str(REPO / "examples" / "starved_loader.py"), "--steps", "8"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1. dataloader-starvation: DataLoader num_workers=" in done.stdout


def test_a_fix_that_made_the_step_slower_is_said_so():
    from advisor.findings import Verification
    from advisor.reports._common import saving_verb, verification_line

    slower = _finding("loader").model_copy(update={"verification": Verification(
        applied="DataLoader num_workers=1", before_ms_per_step=37.2, after_ms_per_step=41.3,
        measured_saving_ms_per_step=-4.1, inside_range=False, clear_of_noise=True, trials=8, steps_timed=20)})
    line = verification_line(slower)
    assert "made the step 4.10 ms SLOWER" in line and "does not pay" in line and "saved" not in line
    # its headline figure is a prediction, not a saving, wherever the finding is shown
    assert saving_verb(slower) == "Predicted to save" and saving_verb(_finding("loader")) == "Saves"


def test_a_dataloader_fix_is_timed_after_its_workers_prefetched_batches():
    assert FixPlan("dataloader", {"num_workers": 8}).trial_steps(2, 20) == (17, 20)
    assert FixPlan("dataloader", {"num_workers": 16}).trial_steps(2, 20) == (33, 32)
    assert FixPlan("dataloader", {"pin_memory": True}).trial_steps(2, 20) == (2, 20)
    assert FixPlan("tf32").describe().endswith("(changes numerics)")


def test_every_fix_at_once_leaves_out_a_fix_verify_measured_slower():
    from advisor.diagnosis import diagnose, with_verified
    from advisor.findings import Verification
    from advisor.importers.loader import load
    from tests.builders import REPO

    diagnosis = diagnose(load(REPO / "cases" / "cpu_masked_pooling" / "session"))
    assert {"batch-loop-in-model", "optimizer-not-fused"} <= set(diagnosis.report.combined.rules)
    slower = Verification(applied="optimizer foreach=False, fused=True", before_ms_per_step=8.0,
                          after_ms_per_step=9.0, measured_saving_ms_per_step=-1.0, inside_range=False,
                          clear_of_noise=True, trials=3, steps_timed=20)
    findings = [f.model_copy(update={"verification": slower}) if f.rule == "optimizer-not-fused" else f
                for f in diagnosis.findings]
    report = with_verified(diagnosis, findings)
    assert "optimizer-not-fused" not in report.combined.rules and "batch-loop-in-model" in report.combined.rules
    assert report.combined.ms_per_step < diagnosis.report.combined.ms_per_step
    unchanged = with_verified(diagnosis, list(diagnosis.findings))
    assert unchanged.combined == diagnosis.report.combined


def test_the_budget_bounds_the_trials_a_pair_that_would_not_end_in_time_is_not_started():
    """Pairs of 0.6 s in a budget of 1.5 s: the second would end past it, so it never starts;
    a pair was started whenever any time at all was left, and ran 15-40 s past --budget."""
    import time as clock

    finding = _finding("loader", ms=10.0)
    trial = Trial(0, "loader", FixPlan("dataloader", {"num_workers": 1}))
    timeouts = []

    def run(plan, timeout_s):
        timeouts.append(timeout_s)
        clock.sleep(0.3)
        return {"durations_ns": [int((10.0 if plan["fixes"] else 20.0) * 1e6)] * 3, "ended": "stopped"}

    start = clock.monotonic()
    [out] = verify_findings([finding], [trial], script="x.py", args=[], step_source=None, warmup=0, steps=3,
                            budget_s=1.0, say=lambda line: None, run=run)
    assert clock.monotonic() - start <= 1.0 + 0.3  # at most one run's lag on a slow machine
    assert out.verification is not None and out.verification.trials == 1
    assert all(t <= 1.0 for t in timeouts), "no run may take longer than what is left of the budget"


def test_every_fix_at_once_starts_from_the_step_the_window_line_states():
    """"every fix at once: 11.4 ms -> 8.65 ms" beside a Window line of 8.46 ms read as two
    different steps: the combined estimate starts from the report's step."""
    from advisor.diagnosis import diagnose
    from advisor.importers.loader import load
    from tests.builders import REPO

    for case in ("cpu_masked_pooling", "cpu_copied_threads", "cpu_loss_loop"):
        diagnosis = diagnose(load(REPO / "cases" / case / "session"))
        combined, model = diagnosis.report.combined, diagnosis.model
        assert combined is not None
        assert combined.step_before_ms == pytest.approx((model.mean_step_ns + model.times.beside_ns) / 1e6, abs=1e-3)
        assert combined.step_after_ms == pytest.approx(combined.step_before_ms - combined.ms_per_step, abs=1e-3)
