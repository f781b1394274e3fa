"""Fuzz the trace reader: N mutated traces through `advisor diagnose`, and the outcomes.

Each input is a real trace (../shared/traces/bert_small_infer_h100.json.gz where it
exists, else a synthetic one from benchmarks/synth.py) with one mutation of a kind a
damaged file shows: cut off (plain or gzipped), a byte flipped, a key deleted, a value of
the wrong type, a NaN or Infinity literal, an id past int64, invalid UTF-8 in a name,
torch's unescaped quotes in a name, a category given as a list, nesting 100 000 deep,
garbage after the array. Every input goes through `advisor diagnose FILE --format json`
(the command line's own entry point, in a pool of worker processes, 60 s each) and ends as
one of:

    full report      exit 0, a report valid against its schema that notes no damage
    salvaged report  exit 0, a valid report that says what was skipped, repaired or cut off
    clean error      a non-zero exit with one `advisor:` line
    traceback        an exception escaped, or more than one line of error
    hang             no answer in 60 s

    python benchmarks/fuzz.py --n 2000
    python benchmarks/fuzz.py --n 200 --seed 3 --base trace.json.gz
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import io
import json
import multiprocessing
import os
import random
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "traces" / "bert_small_infer_h100.json.gz"
OUTCOMES = ("full report", "salvaged report", "clean error", "traceback", "hang")
TIMEOUT_S = 60
_KEY = re.compile(rb'"(dur|ts|pid|tid|cat|name|args|External id|correlation|Input Dims|ph)": ?')
_NUMBER = re.compile(rb'(?<=": )-?\d+(\.\d+)?')
_NAME = re.compile(rb'"name": ?"([^"\\]{2,40})"')


def _at(rng: random.Random, data: bytes, pattern: re.Pattern) -> re.Match | None:
    matches = list(pattern.finditer(data, 0, min(len(data), 400_000)))
    return rng.choice(matches) if matches else None


def _value_end(data: bytes, start: int) -> int:
    """Where the JSON value starting at ``start`` ends (the next , } or ] at its depth)."""
    depth, i = 0, start
    while i < len(data):
        c = data[i]
        if c in b"[{":
            depth += 1
        elif c in b"]}":
            if depth == 0:
                return i
            depth -= 1
        elif c == ord(",") and depth == 0:
            return i
        elif c == ord('"'):
            i += 1
            while i < len(data) and data[i] != ord('"'):
                i += 2 if data[i] == ord("\\") else 1
        i += 1
    return i


def _replace_value(data: bytes, match: re.Match, new: bytes) -> bytes:
    """Replace the value that follows a "key": match."""
    return data[:match.end()] + new + data[_value_end(data, match.end()):]


def mutate(rng: random.Random, data: bytes) -> tuple[str, bytes, bool]:
    """(mutation kind, the file's bytes, whether they are gzipped)."""
    kind = rng.choice(["truncated", "truncated gzip", "byte flip", "deleted key", "wrong type", "NaN literal",
                       "64-bit id", "invalid UTF-8", "unescaped quote", "category list", "deep nesting",
                       "garbage after"])
    if kind == "truncated":
        return kind, data[:rng.randrange(1, len(data))], False
    if kind == "truncated gzip":  # the whole trace gzipped, the gzip stream cut
        packed = gzip.compress(data)
        return kind, packed[:rng.randrange(20, len(packed))], True
    if kind == "byte flip":
        at = rng.randrange(len(data))
        return kind, data[:at] + bytes([rng.choice(b'{}[]",:\\ 0aN\xff\x00')]) + data[at + 1:], False
    if kind == "deleted key":
        match = _at(rng, data, _KEY)
        if match is None:
            return kind, data, False
        end = _value_end(data, match.end())
        end += 1 if data[end:end + 1] == b"," else 0
        return kind, data[:match.start()] + data[end:], False
    if kind == "wrong type":
        match = _at(rng, data, _KEY)
        new = rng.choice([b"[1, 2]", b'{"a": 1}', b'"x"', b"true", b"null", b"-1e999"])
        return kind, _replace_value(data, match, new) if match else data, False
    if kind in ("NaN literal", "64-bit id"):
        match = _at(rng, data, _NUMBER)
        new = rng.choice([b"NaN", b"Infinity", b"-Infinity"]) if kind == "NaN literal" else \
            rng.choice([b"18446744073709551615", b"1180591620717411303424", b"-9223372036854775809"])
        return kind, data[:match.start()] + new + data[match.end():] if match else data, False
    if kind in ("invalid UTF-8", "unescaped quote"):
        match = _at(rng, data, _NAME)
        if match is None:
            return kind, data, False
        inner = match.group(1)
        middle = len(inner) // 2
        new = inner[:middle] + (b"\xff\xfe" if kind == "invalid UTF-8" else b'"quoted"') + inner[middle:]
        return kind, data[:match.start(1)] + new + data[match.end(1):], False
    if kind == "category list":
        return kind, data.replace(b'"cat": "', b'"cat": ["', 1).replace(b'", "name"', b'"], "name"', 1), False
    if kind == "deep nesting":
        at = data.find(b'"traceEvents": [') + len(b'"traceEvents": [')
        return kind, data[:at] + b"[" * 100_000 + b"]" * 100_000 + b"," + data[at:], False
    return kind, data + rng.choice([b"garbage", b"\x00\x00\x00", b"]}]}", b"{"]), False


def run_one(path: str) -> tuple[str, str]:
    """(outcome, detail) of `advisor diagnose PATH --format json` in this process."""
    from advisor.cli import main
    from advisor.reports.schema import validate_report

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["diagnose", path, "--format", "json"])
    except BaseException as exc:  # noqa: BLE001  (what the fuzz looks for)
        return "traceback", f"{type(exc).__name__}: {exc}"[:200]
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if code != 0:
        ok = len(lines) == 1 and lines[0].startswith("advisor: ")
        return ("clean error" if ok else "traceback"), (lines[0] if lines else "")[:200]
    try:
        report = json.loads(out.getvalue())
        validate_report(report)
    except Exception as exc:  # noqa: BLE001
        return "traceback", f"invalid report: {exc}"[:200]
    damaged = any(re.search(r"skipped|repaired|cut off|damaged|could not", n) for n in report["notes"]) or any(
        f["rule"] == "profile-incomplete" for f in report["findings"])
    return ("salvaged report" if damaged else "full report"), ""


def base_trace() -> bytes:
    if SHARED.is_file():
        return gzip.decompress(SHARED.read_bytes())
    sys.path.insert(0, str(HERE))
    from synth import generate

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "base.json"
        generate(path, 20_000)
        return path.read_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="mutated traces")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--base", type=Path, help="the trace to mutate (default: the shared BERT trace)")
    args = parser.parse_args(argv)
    os.environ["ADVISOR_NO_CACHE"] = "1"
    os.environ["ADVISOR_NO_PROGRESS"] = "1"
    data = (gzip.decompress(args.base.read_bytes()) if args.base and args.base.suffix == ".gz"
            else args.base.read_bytes() if args.base else base_trace())
    rng = random.Random(args.seed)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory() as folder:
        jobs = []
        for i in range(args.n):
            kind, mutated, gz = mutate(rng, data)
            path = Path(folder) / f"t{i}.json{'.gz' if gz else ''}"
            path.write_bytes(mutated)
            jobs.append((kind, str(path)))
        context = multiprocessing.get_context("spawn")
        pool = context.Pool(args.workers)
        try:
            pending = [(kind, path, pool.apply_async(run_one, (path,))) for kind, path in jobs]
            for done, (kind, path, result) in enumerate(pending, 1):
                try:
                    outcome, detail = result.get(timeout=TIMEOUT_S)
                except multiprocessing.TimeoutError:
                    outcome, detail = "hang", ""
                    pool.terminate()
                    pool = context.Pool(args.workers)
                    # the rest are resubmitted to the new pool
                    pending[done:] = [(k, p, pool.apply_async(run_one, (p,))) for k, p, _ in pending[done:]]
                counts[kind][outcome] += 1
                examples.setdefault((kind, outcome), detail)
                if done % 100 == 0:
                    print(f"fuzz: {done} of {len(pending)}", file=sys.stderr, flush=True)
        finally:
            pool.terminate()
    total = collections.Counter()
    print(f"fuzz: {args.n} mutated traces (seed {args.seed}), `advisor diagnose FILE --format json`, {TIMEOUT_S} s each")
    print(f"{'mutation':18}" + "".join(f"{o:>17}" for o in OUTCOMES))
    for kind in sorted(counts):
        print(f"{kind:18}" + "".join(f"{counts[kind][o]:>17}" for o in OUTCOMES))
        total.update(counts[kind])
    print(f"{'all':18}" + "".join(f"{total[o]:>17}" for o in OUTCOMES))
    bad = [(k, o, d) for (k, o), d in examples.items() if o in ("traceback", "hang")]
    for kind, outcome, detail in bad:
        print(f"  {outcome} on {kind}: {detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
