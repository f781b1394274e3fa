"""Shared test fixtures: where the real traces are, and small hand-made traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"


def shared_trace(name: str) -> Path:
    """A trace from ../shared/traces, or a skip where that folder is absent."""
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"real trace {name} not available: ../shared/traces is absent on this machine")
    return path


def write_trace(path: Path, events: list[dict], **top) -> Path:
    document = {"schemaVersion": 1, **top, "traceEvents": events}
    data = json.dumps(document).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


@pytest.fixture
def make_trace(tmp_path):
    def make(events: list[dict], name: str = "trace.json", **top) -> Path:
        return write_trace(tmp_path / name, events, **top)

    return make
