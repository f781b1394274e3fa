"""The cache holds data the user wrote, never code and never another's: a folder someone
else owns or may write is not used, nothing in it is unpickled, and a damaged or edited
record is dropped and computed again, never served (advisor.importers.cache)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import pwd
import re
import subprocess
import sys

import pytest
from builders import synth_trace, write_trace
from conftest import REPO

from advisor.importers import cache, load

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow


class _RunsCode:
    """A pickle that runs code where it is loaded: writes a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _diagnose(trace, *extra, env=None):
    return subprocess.run([sys.executable, "-m", "advisor", "diagnose", str(trace), "--format", "json", *extra],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})}, check=False)


def _plant(folder, trace, marker):
    """What an attacker who may write ``folder`` plants for ``trace``: a pickle where the
    tables were once kept and a forged report record, under the entry's computable key."""
    entry = folder / cache.cache_key(trace)
    entry.mkdir(parents=True, exist_ok=True)
    for name in ("tables-0.pkl", "tables.pkl"):
        (entry / name).write_bytes(pickle.dumps(_RunsCode(marker)))
    forged = json.dumps({"schema_version": 1, "findings": [], "forged": True})
    for record in ("report-0.json",):
        body = json.dumps({"record": "advisor-report-record/1", "inputs": [], "said": [], "worst": -1,
                           "config_fail_on": None, "config_source": ""}) + "\n" + forged
        (entry / record).write_text(hashlib.sha256(body.encode()).hexdigest() + "\n" + body)
    return entry


def test_a_cache_folder_others_may_write_is_not_used_and_nothing_planted_runs(tmp_path):
    trace = tmp_path / "train.json"
    synth_trace(trace, 2000)
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    marker = tmp_path / "pwned"
    _plant(shared, trace, marker)
    for _ in range(2):
        done = _diagnose(trace, env={"ADVISOR_CACHE_DIR": str(shared)})
        assert done.returncode == 0, done.stderr
        assert not marker.exists()
        report = json.loads(done.stdout)
        assert "forged" not in report and report["findings"]
        said = [line for line in done.stderr.splitlines() if "cache folder" in line]
        assert len(said) == 1 and "writable by its group and others (mode 777): not used" in said[0], done.stderr
    # Nothing was written there either: the entry holds what was planted and no more.
    (entry,) = [p for p in shared.iterdir()]
    assert sorted(p.name for p in entry.iterdir()) == ["report-0.json", "tables-0.pkl", "tables.pkl"]


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_folder_another_user_owns_is_not_used(tmp_path):
    trace = tmp_path / "train.json"
    synth_trace(trace, 2000)
    theirs = tmp_path / "their-cache"
    theirs.mkdir(mode=0o755)
    marker = tmp_path / "pwned"
    entry = _plant(theirs, trace, marker)
    nobody = pwd.getpwnam("nobody").pw_uid
    for path in (theirs, entry, *entry.iterdir()):
        os.chown(path, nobody, -1)
    done = _diagnose(trace, env={"ADVISOR_CACHE_DIR": str(theirs)})
    assert done.returncode == 0, done.stderr
    assert not marker.exists() and "forged" not in json.loads(done.stdout)
    assert f"owned by another user (uid {nobody}): not used" in done.stderr


def test_an_entry_of_another_owner_in_the_user_s_folder_is_a_miss(tmp_path, cache_dir):
    if os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    trace = write_trace(tmp_path / "t.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                               "ts": 0, "dur": 5}])
    load(trace)
    (entry,) = cache_dir.iterdir()
    os.chown(entry / "events.parquet", pwd.getpwnam("nobody").pw_uid, -1)
    assert cache.cached(trace) is None
    assert entry.exists(), "another's file is left where it is, not removed"


def test_a_group_writable_entry_file_is_a_miss(tmp_path, cache_dir):
    trace = write_trace(tmp_path / "t.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                               "ts": 0, "dur": 5}])
    load(trace)
    (entry,) = cache_dir.iterdir()
    assert cache.cached(trace) is not None
    (entry / "session.json").chmod(0o664)
    assert cache.cached(trace) is None


def test_entries_are_private_whatever_the_umask(tmp_path, cache_dir):
    old = os.umask(0o002)
    try:
        load(write_trace(tmp_path / "t.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                                "ts": 0, "dur": 5}]))
    finally:
        os.umask(old)
    assert oct(cache_dir.stat().st_mode & 0o777) == oct(0o700)
    (entry,) = cache_dir.iterdir()
    assert all(p.stat().st_mode & 0o077 == 0 for p in [entry, *entry.iterdir()])


def test_a_changed_session_file_is_dropped_and_read_again(tmp_path, cache_dir):
    trace = write_trace(tmp_path / "t.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                               "ts": 10 * i, "dur": 5} for i in range(4)])
    load(trace)
    (entry,) = cache_dir.iterdir()
    meta = json.loads((entry / "session.json").read_text())
    meta["source"] = "forged"
    (entry / "session.json").write_text(json.dumps(meta))
    assert cache.cached(trace) is None and not entry.exists()
    assert load(trace).meta.source != "forged"


def test_no_pickle_is_read_anywhere_in_advisor():
    """The cache and every reader: no pickle, marshal or allow_pickle on what is read back,
    and YAML only through a safe loader."""
    import yaml

    from advisor.knowledge import hardware

    offenders = []
    for path in (REPO / "advisor").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for needle in ("pickle.load(", "marshal.load", "allow_pickle=True", "torch.load(", "yaml.load(",
                           "yaml.unsafe_load", "dill."):
                if needle in line and not (needle == "yaml.load(" and "Loader=_LOADER" in line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {needle}")
    # forked.py passes results between a process and its own fork through a pipe, never a file.
    assert [o for o in offenders if not o.startswith("advisor/importers/forked.py")] == []
    assert issubclass(hardware._LOADER, yaml.SafeLoader) or hardware._LOADER.__name__ == "CSafeLoader"


def test_a_truncated_or_edited_report_record_is_dropped_not_served(tmp_path, cache_dir):
    trace = tmp_path / "train.json"
    synth_trace(trace, 2000)
    first = _diagnose(trace)
    assert first.returncode == 0, first.stderr
    (record,) = cache_dir.glob("*/report-*.json")
    record.write_bytes(record.read_bytes()[:700])
    cut = _diagnose(trace)
    assert cut.returncode == 0 and json.loads(cut.stdout)["findings"]
    (record,) = cache_dir.glob("*/report-*.json")  # written again, whole
    text = record.read_text()
    # Every finding's severity turned to info: a record edited by hand, whatever it held.
    record.write_text(re.sub(r'"severity": ?"(critical|high|medium|low)"', '"severity": "info"', text))
    assert record.read_text() != text, "the edit changed the record"
    edited = _diagnose(trace)
    assert edited.returncode == 0
    fresh, served = json.loads(first.stdout), json.loads(edited.stdout)
    for report in (fresh, served):
        report.pop("generated", None)
    assert served == fresh


def test_a_trace_whose_name_is_not_text_is_cached(tmp_path, cache_dir):
    name = os.fsdecode(b"tr\xffce.json")
    trace = write_trace(tmp_path / name, [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                           "ts": 0, "dur": 5}])
    load(trace)
    assert cache.cached(trace) is not None
