"""The metadata advisor's host collector writes into the Chrome trace it exports, and
reads back from it.

The collector hands it to torch.profiler (``prof.add_metadata_json``) under the trace's
top-level key ``advisor``; the importer finds it there, so a trace advisor wrote is read
with what the collector knew (partial steps, the script, how the run ended).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

__all__ = ["METADATA_KEY", "read_trace_metadata", "trace_metadata_json"]

METADATA_KEY = "advisor"
"""Top-level key of the exported Chrome trace that holds :meth:`HostCollection.metadata`;
read it back with :func:`read_trace_metadata`."""

# torch's exporter turns every backslash in trace metadata into a slash (so JSON escapes
# such as \" come out broken), so strings go in with the characters that JSON would
# escape, and %, percent-encoded. Non-ASCII text passes through as it is.
_TRACE_UNSAFE = re.compile(r'[%"\\\x00-\x1f\x7f]')
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _to_trace(value: Any) -> Any:
    if isinstance(value, str):
        value = _SURROGATE.sub("\ufffd", value)
        return _TRACE_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", value)
    if isinstance(value, dict):
        return {_to_trace(k): _to_trace(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_trace(v) for v in value]
    return value


def _from_trace(value: Any) -> Any:
    if isinstance(value, str):
        return unquote(value) if "%" in value else value
    if isinstance(value, dict):
        return {_from_trace(k): _from_trace(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_trace(v) for v in value]
    return value


def trace_metadata_json(metadata: dict[str, Any]) -> str:
    """``metadata`` as the JSON text handed to ``prof.add_metadata_json``."""
    return json.dumps(_to_trace({**metadata, "strings": "percent-encoded"}), ensure_ascii=False)


def read_trace_metadata(document: Mapping[str, Any]) -> dict[str, Any] | None:
    """The collector's metadata from a loaded Chrome trace's top level, strings decoded;
    None where the trace was not written by advisor's host collector."""
    raw = document.get(METADATA_KEY)
    if not isinstance(raw, dict) or raw.get("collector") != "advisor-host":
        return None
    decoded = _from_trace(raw)
    decoded.pop("strings", None)
    return decoded
