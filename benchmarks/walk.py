"""A walk of `advisor diagnose TARGET` from the command line to the diagnosis: which of
advisor's modules the flow passes through before it reaches ``advisor.diagnosis.diagnose``
(what the user typed, classified and opened), measured by running it.

Every call into, and every return to, a function of the advisor package moves the walk to
that function's module; a stay in one module is one stop. The front of the flow (the
command line, the API, the target stage, the job's rooms) is counted module by module;
the rooms below it by package (``advisor.importers`` reading a trace, ``advisor.collect``
running a script under the hooks, ``advisor.rules`` loading the packs: one stop each
time the walk goes down into them); the leaves every room uses (advisor.units, paths,
errors, the lazy imports) are passed through, and so is the code modules run as they are
imported (a check registering itself). It prints:

- stops: the modules the walk stands in, one after another (a module left and entered
  again counts again);
- files: the distinct modules among them;
- climbs back up: moves from a module to one in a higher layer of the flow (the layers of
  pyproject.toml's import-linter contract: cli above api above targets ... above session);
- entries into advisor.cli: moves into the command line's package from elsewhere;
- stays in cli/__init__.py: the stops in the command line's own module.

Run it against another checkout to compare (``--repo``: its advisor package is imported
instead of this one):

    python benchmarks/walk.py ../shared/traces/resnet50_v100_num_workers_0.pt.trace.json.gz
    python benchmarks/walk.py --repo /tmp/before TRACE
    python benchmarks/walk.py -- examples/json_records.py --steps 12   # a script: its arguments after --
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from itertools import pairwise
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
FRONT = ("advisor.cli", "advisor.api", "advisor.targets", "advisor.job", "advisor.__main__")
# Leaves every room uses (lazy imports, paths, units, errors): passed through, not stops.
LEAVES = ("advisor._lazy", "advisor.paths", "advisor.units", "advisor.errors", "advisor._version")


def layers_of(repo: Path) -> list[list[str]]:
    """The layers of the flow, top first, from the repository's import-linter contract."""
    import tomllib

    config = tomllib.loads((repo / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract.get("type") == "layers":
            return [[part.strip() for part in layer.split("|")] for layer in contract["layers"]]
    return []


def layer(module: str, layers: list[list[str]]) -> int | None:
    for i, names in enumerate(layers):
        if any(module == name or module.startswith(name + ".") for name in names):
            return i
    return None


def walk(target: list[str], package: Path) -> list[str]:
    """The modules the walk stands in, in order, up to the call of diagnose()."""
    from advisor.cli import main

    root = str(package) + os.sep
    stops: list[str] = []
    done = False
    importing = 0  # modules being imported: their code runs once, it is not the command's walk

    def module_of(frame) -> str | None:
        file = frame.f_code.co_filename
        if not file.startswith(root):
            return None
        name = file[len(str(package.parent)) + 1:-3].replace(os.sep, ".")
        name = name.removesuffix(".__init__")
        if name.startswith(FRONT):
            return name
        return ".".join(name.split(".")[:2])

    def profile(frame, event, arg):
        nonlocal done, importing
        if done or event not in ("call", "return"):
            return
        if frame.f_code.co_name == "<module>":
            importing += 1 if event == "call" else -1
            return
        if importing:
            return
        where = frame if event == "call" else frame.f_back
        if where is None:
            return
        module = module_of(where)
        if module is None or module in LEAVES:
            return
        if event == "call" and module == "advisor.diagnosis" and frame.f_code.co_name == "diagnose":
            stops.append(module)
            done = True
            return
        if not stops or stops[-1] != module:
            stops.append(module)

    with tempfile.TemporaryDirectory() as folder:
        sys.setprofile(profile)
        try:
            main(["diagnose", "--no-cache", "-f", "json", "-o", str(Path(folder) / "r.json"), *target])
        finally:
            sys.setprofile(None)
    return stops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="+", help="what `advisor diagnose` is given (a trace, a session, a script)")
    parser.add_argument("--repo", type=Path, default=HERE, help="the checkout whose advisor to walk (default: this)")
    parser.add_argument("--show", action="store_true", help="print the stops, one a line")
    args = parser.parse_args()
    repo = args.repo.resolve()
    sys.path.insert(0, str(repo))
    os.environ["ADVISOR_NO_PROGRESS"] = "1"
    import advisor

    package = Path(advisor.__file__).resolve().parent
    if package.parent != repo:
        raise SystemExit(f"walk: imported {package}, not the advisor of {repo}")
    layers = layers_of(repo)
    stops = walk(args.target, package)
    climbs = sum(1 for a, b in pairwise(stops)
                 if layer(a, layers) is not None and layer(b, layers) is not None and layer(b, layers) < layer(a, layers))
    into_cli = sum(1 for a, b in pairwise(stops) if b.startswith("advisor.cli") and not a.startswith("advisor.cli"))
    if args.show:
        print("\n".join(stops))
    print(f"{repo.name}: {len(stops)} stops, {len(set(stops))} files, {climbs} climbs back up, "
          f"{into_cli} entries into advisor.cli, {stops.count('advisor.cli')} stays in cli/__init__.py "
          "(up to advisor.diagnosis.diagnose)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
