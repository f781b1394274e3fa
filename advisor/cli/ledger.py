"""`advisor ledger`: how advisor's promised savings held when the fixes were applied.

    advisor ledger                         the user's ledger (every advisor verify run's measurements)
    advisor ledger FILE...                 other ledgers (the project's own: benchmarks/ledger.jsonl)
    advisor ledger --format markdown       the table as Markdown (docs/ledger.md is made so)
    advisor ledger --format json           the rows and the records as data

One row per rule: the records, the median of measured over predicted saving, the share of
measurements inside the promised range, and the runs where the fix made the step slower
while a saving was promised.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from advisor.errors import UsageError

__all__ = ["add_ledger_parser", "ledger_command"]


def add_ledger_parser(sub: argparse._SubParsersAction) -> None:
    ledger = sub.add_parser("ledger", help="how advisor's promised savings held when the fixes were measured",
                            description="Per rule: the median of measured over predicted saving, how often the "
                                        "measurement fell inside the promised range, and the runs where the fix "
                                        "made the step slower. advisor verify adds its measurements to the "
                                        "user's ledger; benchmarks/savings.py adds the project's own pairs to "
                                        "benchmarks/ledger.jsonl.")
    ledger.add_argument("files", nargs="*", type=Path, metavar="FILE",
                        help="ledgers to read (default: the user's, $ADVISOR_LEDGER or "
                             "~/.local/share/advisor/ledger.jsonl)")
    ledger.add_argument("--format", "-f", default="text", choices=["text", "markdown", "json"],
                        help="output format")


def ledger_command(args: argparse.Namespace) -> int:
    from advisor.paths import special_file
    from advisor.verify.ledger import ledger_path, read, summarise

    files = list(args.files) or [ledger_path()]
    entries, skipped = [], 0
    for path in files:
        what = special_file(path)
        if what is not None:
            raise UsageError(f"{path}: {what}, not a ledger file")
        if args.files and not path.is_file():
            raise UsageError(f"{path}: no such ledger file")
        got = read(path)
        entries += got.entries
        skipped += got.skipped
    rows = summarise(entries)
    if args.format == "json":
        print(json.dumps({"rules": [row.__dict__ | {"sign_wrong": list(row.sign_wrong)} for row in rows],
                          "records": [e.model_dump() for e in entries], "skipped_lines": skipped}, indent=2))
        return 0
    if not entries:
        print(f"advisor: no measurements in {', '.join(map(str, files))} yet: `advisor verify SCRIPT` adds one "
              "for each fix it measures", file=sys.stderr)
        return 0
    print(render(rows, markdown=args.format == "markdown"))
    if skipped:
        print(f"advisor: {skipped} line(s) of the ledger were not records and were skipped", file=sys.stderr)
    return 0


def render(rows: list, *, markdown: bool) -> str:
    header = ("rule", "records", "measured / predicted (median)", "inside the range",
              "slower where a saving was promised")
    body = [(r.rule, str(r.records), f"{r.median_ratio:.2f}x" if r.median_ratio is not None else "-",
             f"{r.inside:.0%}", ", ".join(r.sign_wrong) or "none") for r in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *body])
