"""The house: one package per stage of the flow, imports that run one way, a public
surface that says what it exports, and a docstring on every module.

    collect / importers -> session -> step -> tables -> rules -> findings -> reports

The import contracts live in pyproject.toml ([tool.importlinter]) and are checked here
with import-linter, so `lint-imports` on the command line and the test suite agree.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import advisor

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "advisor"

# The rooms of the house, in the order of the flow, and the few modules every room may
# use. A new top-level module has to be one of these, or go into a room.
ROOMS = ("collect", "importers", "session", "knowledge", "step", "tables", "rules", "reports", "profiler", "doctor", "job",
         "verify", "api", "cli")
FOUNDATIONS = ("__init__", "__main__", "_lazy", "_version", "errors", "findings", "paths",
               "units")
# The one module that assembles the flow (step model, tables, rules, report) for every door,
# and the one that says what a door was given (a script, a trace, a session, a job, a
# merged trace) and opens it alike for every door.
FACADE = ("diagnosis",)
ENTRANCE = ("targets",)

# Packages whose __all__ is their public surface (httpx's habit: it lists exactly what the
# package makes public, and every name in it resolves).
PUBLIC = ("advisor", "advisor.session", "advisor.importers", "advisor.collect", "advisor.knowledge", "advisor.step",
          "advisor.knowledge.costs", "advisor.tables", "advisor.rules", "advisor.rules.packs", "advisor.reports",
          "advisor.profiler", "advisor.doctor")


def _module_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


# -- the import contracts -------------------------------------------------------------------


def test_the_stages_import_only_downstream(capsys):
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "0 broken" in out and "BROKEN" not in out, out


def test_no_module_imports_itself_back_not_even_for_type_hints():
    """No import circle, those made by imports for type hints alone included (the layers
    contract leaves those out): where two modules need each other's types, the one below
    names what it reads of the other as a Protocol of its own."""
    import grimp
    import networkx as nx

    graph = grimp.build_graph("advisor", exclude_type_checking_imports=False, cache_dir=None)
    imports = nx.DiGraph((module, imported) for module in graph.modules
                         for imported in graph.find_modules_directly_imported_by(module))
    circles = [sorted(group) for group in nx.strongly_connected_components(imports) if len(group) > 1]
    assert circles == [], circles


def test_the_contracts_name_every_room():
    """A room the contracts do not mention could import anything."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    named = {part.strip() for layer in layers for part in layer.split("|")}
    for room in ROOMS:
        if (PACKAGE / room).is_dir():
            assert f"advisor.{room}" in named, room
    for module in FOUNDATIONS[2:] + FACADE + ENTRANCE:
        assert f"advisor.{module}" in named, module


# -- the layout -----------------------------------------------------------------------------


def test_the_top_level_is_rooms_and_foundations():
    loose = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in FOUNDATIONS + FACADE + ENTRANCE)
    assert not loose, f"modules outside a room: {loose}; put each in the room of its stage"
    rooms = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert set(rooms) <= set(ROOMS), set(rooms) - set(ROOMS)


@pytest.mark.parametrize("path", _module_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_module_says_what_it_is_for(path):
    # Read, not imported: advisor/__main__.py runs the command line when imported.
    doc = (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    assert len(doc) >= 40, f"{path.relative_to(REPO)} has no docstring saying what it is for"


@pytest.mark.parametrize("room", [r for r in ROOMS if (PACKAGE / r).is_dir()])
def test_every_room_lists_its_modules(room):
    """A room's docstring names each of its public modules and subpackages, so a newcomer
    reads the room from one place."""
    package = importlib.import_module(f"advisor.{room}")
    doc = package.__doc__ or ""
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            assert info.name in doc, f"advisor.{room}'s docstring does not mention {info.name}"


# -- the public surface ---------------------------------------------------------------------


def _names_in_init(name: str) -> tuple[set[str], set[str]]:
    """What a package's __init__ makes public, and what it may export: its top-level
    definitions and the names it imports from its own public modules are public; names
    imported from its private modules (``_registry``) are helpers unless it exports them."""
    module = importlib.import_module(name)
    tree = ast.parse(Path(module.__file__).read_text())
    public: set[str] = set()
    private: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            public.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            public.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{name}."):
            hidden = any(part.startswith("_") for part in node.module[len(name) + 1:].split("."))
            (private if hidden else public).update(a.asname or a.name for a in node.names)
    keep = {"__version__"}
    return ({n for n in public if not n.startswith("_") or n in keep},
            {n for n in private if not n.startswith("_") or n in keep})


def _isort_order(name: str) -> tuple[int, str]:
    """CONSTANTS, then Classes, then functions, each alphabetical (ruff's RUF022 order)."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("name", PUBLIC)
def test_all_is_the_public_surface(name):
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    assert exported == sorted(exported, key=_isort_order), f"{name}.__all__ is not sorted"
    for item in exported:
        value = getattr(module, item)  # lazy exports resolve here
        assert not isinstance(value, types.ModuleType), f"{name}.{item} is a module"
    # Names exported lazily (advisor._lazy) are in _EXPORTS, the rest defined or imported.
    lazy = set(getattr(module, "_EXPORTS", None) or ())
    assert lazy <= set(exported), f"{name}: lazy exports not in __all__: {sorted(lazy - set(exported))}"
    public, helpers = _names_in_init(name)
    assert public <= set(exported), f"{name}: public but not in __all__: {sorted(public - set(exported))}"
    unknown = set(exported) - public - helpers - lazy
    assert not unknown, f"{name}: in __all__ but neither defined, imported nor lazy: {sorted(unknown)}"


def test_star_import_gives_exactly_the_public_surface():
    namespace: dict = {}
    exec("from advisor import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(advisor.__all__)


def test_the_version_is_one_figure():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" in project.get("dynamic", []), "the version lives in advisor/_version.py only"
    from advisor.reports.build import __version__ as reported

    assert reported == advisor.__version__


# What `advisor diagnose TRACE` may not have imported when it opens the trace to read it:
# the collector (torch's hooks), the HTML report, the graph library. Each is for another
# command or comes after the read; importing it first makes every small trace wait. Where
# the trace is read ahead by a forked process (advisor.importers.ahead), that process is
# the one reading it, forked before the command's own imports; it does not import the
# Session's models (pydantic) either, which the command imports meanwhile, and makes the
# Session of what was read.
_NOT_BEFORE_THE_READ = ("advisor.collect.torch_hooks", "advisor.collect.assemble", "advisor.reports._html",
                        "advisor.reports._terminal", "networkx", "torch")
_NOT_IN_THE_FORKED_READ = ("pydantic",)

# The first open of the trace by the reader (kineto.open_trace; not a look at its first
# bytes to decide how to read it, nor the cache's digest of its head and tail, which the
# command may make meanwhile): the modules of the process opening it, which then ends.
_WATCH_THE_OPEN = r'''
import os, sys
target = os.path.abspath(sys.argv[1])
def by_the_reader():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "open_trace" and frame.f_code.co_filename.endswith("kineto.py"):
            return True
        frame = frame.f_back
    return False
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and os.path.abspath(args[0]) == target \
            and "advisor.importers.kineto" in sys.modules and by_the_reader():
        print("LOADED " + " ".join(sorted(sys.modules)), file=sys.stderr)
        sys.stderr.flush()
        os._exit(0)
sys.addaudithook(hook)
from advisor.cli import main
main(["diagnose", target, "--format", "json", "--no-cache"])
'''


@pytest.mark.parametrize("processes", ["1", "2"])
def test_diagnosing_a_trace_reads_it_before_importing_what_it_does_not_need(make_trace, processes):
    import os
    import subprocess
    import sys

    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    done = subprocess.run([sys.executable, "-c", _WATCH_THE_OPEN, str(trace)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "ADVISOR_PROCESSES": processes})
    line = next(x for x in done.stderr.splitlines() if x.startswith("LOADED "))
    loaded = set(line.split()[1:])
    assert "advisor.importers.kineto" in loaded  # the hook saw the trace's own open
    unwanted = set(_NOT_BEFORE_THE_READ) | (set(_NOT_IN_THE_FORKED_READ) if processes == "2" else set())
    assert not loaded & unwanted, sorted(loaded & unwanted)


def test_the_forked_read_never_imports_the_sessions_models(make_trace):
    """The whole of read_kineto (advisor.importers.ahead's forked read), not only its first
    open of the trace, runs without pydantic: the command imports it meanwhile."""
    import subprocess
    import sys

    trace = make_trace([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
                        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1, "dur": 3,
                         "args": {"device": 0, "stream": 7, "correlation": 1}}])
    code = ("import sys; from pathlib import Path; from advisor.importers.loader import read_kineto; "
            "events, fields = read_kineto(Path(sys.argv[1])); "
            "print(len(events), sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic')[:3])")
    done = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2 []", done.stdout  # its events read, pydantic never imported


def test_no_import_circles():
    """Modules that import each other, however indirectly, cannot be understood one at a
    time: the package has none (imports made only for the type checker aside)."""
    import grimp
    import networkx as nx

    graph = grimp.build_graph("advisor", exclude_type_checking_imports=True)
    imports = nx.DiGraph((module, imported) for module in graph.modules
                         for imported in graph.find_modules_directly_imported_by(module))
    circles = [sorted(c) for c in nx.strongly_connected_components(imports) if len(c) > 1]
    assert circles == [], circles


def test_the_readme_is_for_users_and_the_rest_is_the_documentation_site():
    """The README stays short (what advisor does, the two commands, what it prints, the
    commands); the rest lives in docs/, built by MkDocs, every page of it in the site's nav."""
    import yaml

    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 500
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = {next(iter(entry.values())) for entry in config["nav"]}
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages == listed, f"pages not in the nav: {sorted(pages - listed)}; missing: {sorted(listed - pages)}"
    for page in pages - {"index.md"}:
        assert f"docs/{page}" in readme or page in ("profiler_api.md",), f"the README does not point at docs/{page}"
