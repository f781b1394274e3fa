"""The modules a command passes through: what a newcomer opens to follow it.

Runs ``advisor ARGS`` in a fresh process with a profile hook that notes, in order of first
call, every advisor module whose code runs in the command's own process (forked helpers
are theirs), and prints them with the number of calls into each. Point ``--source`` at
another checkout (a ``git worktree`` of an older commit) to list that one's flow:

    python benchmarks/flow.py diagnose ../shared/traces/resnet50_v100_num_workers_0.pt.trace.json.gz
    git worktree add /tmp/before <commit>
    python benchmarks/flow.py --source /tmp/before diagnose <the same trace>

Modules of the report's renderers, the rules' checks and the tables are counted as the
command ran them; pass ``--format json`` and the like as the command would take them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
os.environ["ADVISOR_NO_CACHE"] = "1"
seen = {}
root = os.path.join(sys.argv[1], "advisor") + os.sep

def hook(frame, event, arg):
    if event == "call":
        name = frame.f_code.co_filename
        if name.startswith(root):
            seen[name] = seen.get(name, 0) + 1

sys.setprofile(hook)
import io, contextlib
from advisor.cli import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        code = main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code
sys.setprofile(None)
print(json.dumps({"code": code, "modules": [[os.path.relpath(k, sys.argv[1]), v] for k, v in seen.items()]}))
"""


def flow(source: Path, command: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(source), *command], capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONPATH": str(source)})
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"the command failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose advisor runs (default: this one)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the advisor command and its arguments")
    args = parser.parse_args()
    if not args.command:
        parser.error("give the command, e.g. diagnose TRACE")
    found = flow(args.source.resolve(), args.command)
    modules = found["modules"]
    print(f"advisor {' '.join(args.command)}  (exit {found['code']}, {args.source})")
    print(f"{len(modules)} modules run code in the command's process, in order of first call:")
    for name, calls in modules:
        print(f"  {calls:>9,}  {name}")


if __name__ == "__main__":
    main()
