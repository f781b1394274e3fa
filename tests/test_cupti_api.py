"""The CUPTI collector against the real cupti-python, without a GPU.

cupti-python installs and imports on any Linux machine; what the collector calls of it
(functions, enum members and their values, the fields of each record class) can be
checked there, so an API change in a new release is caught before a user with a GPU
meets it. .ci/run installs each supported major (12 and 13, through the project's
``cuda12`` and ``cuda`` extras) into a virtual environment of its own under
.ci/venvs/; each is checked in a child process, since the two cannot share one.
"""

from __future__ import annotations

import json
import subprocess
import types
from pathlib import Path

import pytest

from advisor.collect import cupti_records as rec

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
VENVS = {12: REPO / ".ci" / "venvs" / "cupti12", 13: REPO / ".ci" / "venvs" / "cupti13"}
CHECK = (
    "import json, importlib.metadata as m\n"
    "from cupti import cupti\n"
    "from advisor.collect import cupti_records as rec\n"
    "print(json.dumps({'version': m.version('cupti-python'), 'problems': rec.api_problems(cupti)}))\n"
)


@pytest.mark.parametrize("major", sorted(VENVS))
def test_the_collector_matches_the_installed_cupti_python(major):
    python = VENVS[major] / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"cupti-python {major} is not installed in {VENVS[major]} (bash .ci/run installs it)")
    done = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["version"].split(".")[0] == str(major)
    assert found["problems"] == [], f"cupti-python {found['version']}: {found['problems']}"


# -- the check itself, on stand-ins --------------------------------------------------------------


def stand_in() -> types.SimpleNamespace:
    """A module shaped like cupti.cupti that has everything the collector reads."""
    api = types.SimpleNamespace()
    for name in rec.API_FUNCTIONS:
        setattr(api, name, lambda *args: None)
    api.ActivityKind = types.SimpleNamespace(**{name: value for value, name in rec.KIND_NAMES.items()})
    api.ExternalCorrelationKind = types.SimpleNamespace(CUSTOM2=rec.EXTERNAL_KIND_CUSTOM2)
    api.ActivityThreadIdType = types.SimpleNamespace(SYSTEM=1)
    for kind, spec in rec.SPECS.items():
        prefix = rec.RECORD_CLASSES[rec.KIND_NAMES[kind]]
        fields = {candidates[0].split(".")[0]: None for _field, candidates, _default in spec.fields}
        existing = getattr(api, prefix + "3", None)
        merged = {**(vars(existing) if existing else {}), **fields}
        setattr(api, prefix + "3", type(prefix + "3", (), merged))
    api.ActivityMemcpy2 = type("ActivityMemcpy2", (), {})  # an older version: not the one judged
    return api


def test_a_complete_api_has_no_problems():
    assert rec.api_problems(stand_in()) == []


def test_a_missing_function_a_moved_enum_and_a_dropped_field_are_each_named():
    api = stand_in()
    del api.activity_flush_all
    api.ActivityKind.MEMSET = 99
    kernel = api.ActivityKernel3
    api.ActivityKernel4 = type("ActivityKernel4", (), {k: v for k, v in vars(kernel).items() if k != "grid_x"})
    problems = rec.api_problems(api)
    assert "cupti.activity_flush_all is missing" in problems
    assert any("ActivityKind.MEMSET is 99" in p for p in problems)
    assert any(p.startswith("ActivityKernel4 (KERNEL) has no grid_x") for p in problems)
