"""`advisor diagnose torchrun [launcher options] train.py ARGS`: profile every rank.

The launcher command is run as the user wrote it, with one change: torchrun starts
``python -m advisor.job.rank_main train.py ARGS`` (its ``-m`` option) instead of the
script, so each rank runs under its own collector without a change to the script
(:mod:`advisor.job.rank_main`). The job's output goes where it always does; its exit code
is kept. Afterwards every rank that saved a session is a source of the job; a rank that
was killed before it could save is named as missing, and loses nothing the others
collected. ``python -m torch.distributed.run`` (and the older ``torch.distributed.launch``)
work the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from advisor.collect.spawned import LAUNCH_FILE
from advisor.errors import UsageError
from advisor.job.launcher import is_launcher
from advisor.job.rank_main import OPTIONS_ENV, SAVE_DIR_ENV

__all__ = ["Launch", "is_launcher", "launch"]

# torchrun options that take a value as the next word (--name value); --name=value is one word.
_VALUED = {
    "--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint",
    "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--max-restarts", "--max_restarts",
    "--monitor-interval", "--monitor_interval", "--start-method", "--start_method", "--role", "--node-rank",
    "--node_rank", "--master-addr", "--master_addr", "--master-port", "--master_port", "--local-addr",
    "--local_addr", "--log-dir", "--log_dir", "-r", "--redirects", "-t", "--tee", "--local-ranks-filter",
    "--local_ranks_filter", "--logs-specs", "--logs_specs", "--event-log-handler", "--numa-binding",
    "--signals-to-handle", "--rdzv_timeout", "--rdzv-timeout",
}
_NOT_A_SCRIPT = {"-m", "--module", "--no-python", "--no_python"}


@dataclass
class Launch:
    """What the launcher run left: the ranks' saved sessions and how each ended."""

    command: list[str]
    exit_code: int | None
    folder: Path
    sources: list[Path] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    endings: dict[int, dict] = field(default_factory=dict)
    world_size: int | None = None

    @classmethod
    def from_folder(cls, folder: Path, *, command: list[str], exit_code: int | None) -> Launch | None:
        """The ranks that saved a session in ``folder`` (rank-N/ with its launch.json), or
        None where none did."""
        found = cls(command=command, exit_code=exit_code, folder=folder)
        for rank_dir in sorted(folder.glob("rank-*")):
            ended_file = rank_dir / LAUNCH_FILE
            if not ended_file.is_file():
                continue
            ended = json.loads(ended_file.read_text())
            found.sources.append(rank_dir)
            found.ranks.append(int(ended["rank"]))
            found.endings[int(ended["rank"])] = ended
            found.world_size = max(found.world_size or 0, int(ended.get("world_size") or 0))
        return found if found.sources else None

    @classmethod
    def from_manifest(cls, folder: Path, manifest: dict) -> Launch:
        """What a saved job's manifest (job.json) says of its launch: how each rank ended."""
        ranks = manifest["ranks"]
        return cls(command=manifest.get("command") or [], exit_code=manifest.get("exit_code"), folder=folder,
                   sources=[folder / r["session"] for r in ranks], ranks=[int(r["rank"]) for r in ranks],
                   endings={int(r["rank"]): r for r in ranks}, world_size=manifest.get("world_size"))

    def annotate(self, job) -> None:
        """Put each rank's exit and the ranks that saved nothing into the job."""
        job.command = self.command
        for entry in job.ranks:
            ended = self.endings.get(entry.rank, {})
            entry.exit_code, entry.ending = ended.get("exit_code"), ended.get("ending")
            entry.rank_from = ended.get("rank_from") or entry.rank_from  # a saved job says how it was numbered
        job.notes = [n for n in job.notes if not n.startswith("Ranks numbered by")]
        job.notes.insert(0, f"Ranks numbered by {' and '.join(sorted({e.rank_from for e in job.ranks}))}.")
        if self.world_size and self.world_size > job.world_size:
            job.world_size = self.world_size
            job.missing = sorted(set(range(self.world_size)) - {e.rank for e in job.ranks})
        if job.missing:
            job.notes = [n for n in job.notes if not n.startswith("Not in the job's profile")]
            job.notes.append(f"Rank{'s' if len(job.missing) > 1 else ''} {', '.join(map(str, job.missing))} saved "
                             "no profile: the process ended before advisor could save it (killed, or it never "
                             "started); the other ranks' profiles are complete.")
        if self.exit_code is not None:
            job.notes.append(f"The launcher exited with code {self.exit_code}.")


def _split(words: list[str]) -> tuple[list[str], str, list[str]]:
    """torchrun's own options, the script, and the script's arguments."""
    i = 0
    while i < len(words):
        word = words[i]
        if word in _NOT_A_SCRIPT:
            raise UsageError(f"torchrun {word}: advisor profiles a .py training script under torchrun; run the "
                             "script by its path instead")
        if word == "--":
            i += 1
            break
        if not word.startswith("-"):
            break
        i += 1 if "=" in word or word not in _VALUED else 2
    if i >= len(words):
        raise UsageError("torchrun: no training script given (torchrun [options] train.py [args])")
    script = words[i]
    if not script.endswith(".py"):
        raise UsageError(f"torchrun {script}: advisor profiles a .py training script under torchrun")
    if not Path(script).is_file():
        raise UsageError(f"{script}: no such training script")
    return words[:i], script, words[i + 1:]


def launch(target: str, script_args: list[str], *, options: dict, save: Path | None,
           say=None) -> Launch:
    """Run the launch with every rank under advisor's collector; return what it left."""
    words = list(script_args)
    if Path(target).name != "torchrun":
        words = words[2:]  # python -m torch.distributed.run
    launcher_options, script, args = _split(words)
    folder = save or Path(tempfile.mkdtemp(prefix="advisor-job-"))
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", *launcher_options,
               "-m", "advisor.job.rank_main", script, *args]
    env = {**os.environ, SAVE_DIR_ENV: str(folder.resolve()), OPTIONS_ENV: json.dumps(options)}
    if say:
        say(f"launching {Path(target).name} with every rank under advisor's collector")
    process = subprocess.Popen(command, env=env)
    # A SIGTERM to advisor goes on to torchrun, which stops the ranks; they save what they
    # collected, so nothing is left running and nothing collected is lost.
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: process.send_signal(signum))
    try:
        try:
            exit_code = process.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached torchrun too (one process group), which passes it to the ranks.
            exit_code = process.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    found = Launch.from_folder(folder, command=[Path(target).name, *script_args], exit_code=exit_code)
    if found is None:
        raise UsageError(f"the launched job saved no profile (the launcher exited with code {exit_code})")
    return found
