"""A trace's report, kept for the next `advisor diagnose` of the same trace with the same
rules and options.

The Session and tables of a trace are cached already (advisor.importers.cache); a second
diagnose still loaded them, ran the rules and built the report, and paid for pandas,
pydantic and the rules to do it. This keeps the report itself, so that second diagnose
(the same report in another format, or the same command again) reads one file: the JSON
report is written as it is, another format is rendered from it.

A report is a function of the trace, the command's options, the rules (packs, their
configuration, plugins) and advisor's own code. The record's name hashes what is known
without reading anything: the trace's cache key (path, size, mtime, its first and last
64 KiB), the options other than where and how the report is written (``-o``,
``--format``, ``--fail-on``), the current folder, the installed rule plugins and
advisor's code and knowledge files. The files the rules came from (the built-in pack,
``--rules`` packs, the configuration file and the places one could be found, the packs
it names) are listed in the record with a digest of each, or of their absence; a record
is used only while every one is unchanged.

The record sits in the trace's cache entry (so it goes when the entry is evicted), is
read only where it is the user's own and its checksum holds (advisor.importers.cache:
``read_record``), and holds, besides the report, what the first run said about its rules on stderr and what
``--fail-on`` needs (the worst finding's severity, the configured fail_on). ``--no-cache``
neither reads nor writes it; nor does a run that saves its session (``--save``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PLUGIN_GROUP", "ReportCache", "Reused", "rule_sources"]

# Options that say where and how the report is written, not what it says.
PRESENTATION = frozenset({"format", "output", "fail_on", "no_cache", "use_cache"})
# What the command keeps beside its options while it runs: the trace's read ahead
# (advisor.importers.ahead), started before the kept report is looked for.
_RUNNING = frozenset({"ahead", "reads_ahead"})
RECORD_FORMAT = "advisor-report-record/1"
# advisor.rules.packs.catalog.ENTRY_POINT_GROUP, named here so a cached report is found
# without importing the rules (pydantic).
PLUGIN_GROUP = "advisor.rules"


@dataclass
class Reused:
    """A kept report: its JSON text and what the run that built it said and decided."""

    report_json: str
    said: list[str]
    worst: int  # index in advisor.findings' severity order of the worst finding, -1 for none
    config_fail_on: str | None
    config_source: str


@dataclass
class ReportCache:
    """The record of one trace, options and environment (``for_args``), read with
    ``get`` and written with ``put`` by the run that built the report."""

    file: Path
    inputs: list[str] = field(default_factory=list)

    @classmethod
    def for_args(cls, args: argparse.Namespace) -> ReportCache | None:
        """The record for diagnosing ``args.target``; None where no record applies (not
        one trace file, the cache off, a --save) or its name cannot be worked out."""
        from advisor.importers import cache
        from advisor.paths import special_file

        target = Path(args.target)
        if (not getattr(args, "use_cache", True) or getattr(args, "save", None) or getattr(args, "script_args", None)
                or getattr(args, "ncu", None) or getattr(args, "kernel_counters", None)  # files the key cannot see
                or target.suffix == ".py" or not target.is_file() or special_file(target) is not None):
            return None  # (a file that is not one of data, /proc/kmsg, blocks the reading of its key)
        try:
            folder = cache.root(create=True)
            if folder is None:
                return None
            entry = folder / cache.cache_key(target)
            options = {k: str(v) if isinstance(v, Path) else v for k, v in sorted(vars(args).items())
                       if k not in PRESENTATION and k not in _RUNNING}
            digest = hashlib.sha256(json.dumps({
                "record": RECORD_FORMAT,
                "entry": entry.name,
                "options": options,
                "cwd": os.getcwd(),
                "plugins": _plugins(),
                "code": cache.code_fingerprint(),
            }, sort_keys=True, default=str).encode())
        except (OSError, ValueError):
            return None
        return cls(entry / f"report-{digest.hexdigest()[:24]}.json")

    def get(self) -> Reused | None:
        """The kept report where the record exists, is the user's own and intact, and every
        file the rules came from is as it was; else None (a damaged record is dropped)."""
        from advisor.importers import cache

        text = cache.read_record(self.file)
        if text is None:
            return None
        try:
            head_line, _newline, report_json = text.partition("\n")
            head = json.loads(head_line)
            if head.get("record") != RECORD_FORMAT:
                return None
            if any(_digest(Path(path)) != digest for path, digest in head["inputs"]):
                return None
            reused = Reused(report_json=report_json, said=[str(line) for line in head["said"]],
                            worst=int(head["worst"]), config_fail_on=head["config_fail_on"],
                            config_source=str(head["config_source"]))
            os.utime(self.file.parent)  # the trace's entry was used just now
            return reused
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def put(self, kept: Reused, inputs: list[Path]) -> None:
        """Keep ``kept``, valid while the files ``inputs`` (the rules' sources) are
        unchanged; quietly nothing where the trace has no cache entry or it cannot be
        written."""
        from advisor.importers import cache

        if not self.file.parent.is_dir() or cache.not_private(self.file.parent) is not None:
            return
        head = {"record": RECORD_FORMAT, "inputs": [[str(p), _digest(p)] for p in inputs], "said": kept.said,
                "worst": kept.worst, "config_fail_on": kept.config_fail_on, "config_source": kept.config_source}
        cache.write_record(self.file, json.dumps(head) + "\n" + kept.report_json)


def rule_sources(args: argparse.Namespace, config: Any) -> list[Path]:
    """The files and folders the rules of a run came from, or could have: the built-in
    pack, the places a configuration file is looked for and the one given, the --rules
    packs and the packs the configuration names."""
    from advisor.paths import rules_dir
    from advisor.rules.packs.catalog import BUILTIN_PACK
    from advisor.rules.packs.config import CONFIG_NAMES

    paths = [rules_dir() / BUILTIN_PACK, *(Path.cwd() / name for name in CONFIG_NAMES)]
    if getattr(args, "config", None) is not None:
        paths.append(Path(args.config))
    paths += [Path(p) for p in getattr(args, "rules", []) or []]
    paths += list(config.pack_paths())
    return [p.absolute() for p in paths]


def _digest(path: Path) -> str | None:
    """A file's contents hashed; a folder's file names and their contents; None where
    there is nothing."""
    try:
        if path.is_dir():
            digest = hashlib.sha256()
            for child in sorted(path.iterdir()):
                digest.update(child.name.encode() + b"\0")
                if child.is_file():
                    digest.update(hashlib.sha256(child.read_bytes()).digest())
            return digest.hexdigest()
        if not path.is_file():  # a FIFO or a device: never opened
            return None if not path.exists() else "not a regular file"
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None
    except OSError as exc:  # unreadable: never equal to what a run that read it saw
        return f"unreadable: {exc.errno}"


def _plugins() -> list[list[str]]:
    """The installed rule plugins: entry point and the version of its distribution."""
    from importlib import metadata

    from_group = metadata.entry_points(group=PLUGIN_GROUP)
    return sorted([e.name, e.value, getattr(e.dist, "version", "") or ""] for e in from_group)
