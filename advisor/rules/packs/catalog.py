"""Which rules there are: the built-in pack, packs from installed plugins, the user's packs,
and what the configuration makes of them.

    rules = load_rules([Path("team.yaml")], config=load_config(find_config([Path.cwd()])))
    selection = rules.configure(config)          # thresholds overridden, ids resolved
    run_rules(session, tables, selection.specs, disabled=selection.disabled,
              enabled=selection.enabled, preview=selection.preview)

Plugins are installed packages with an entry point in the ``advisor.rules`` group:

    [project.entry-points."advisor.rules"]
    acme = "acme_rules:pack"

Loading the entry point imports the module, which registers its Python checks with
``advisor.rules.register`` (as the built-in checks are registered); the object it names
is a rule pack: a path to a YAML pack, a :class:`RulePack`, or a function returning either.
A plugin that fails to load is reported and skipped, as a failing rule is: someone else's
broken package must not stop a diagnosis. A pack the user names that does not validate
stops it: that is the user's own input.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from advisor.paths import rules_dir
from advisor.rules.packs.config import AdvisorConfig, ConfigInvalid
from advisor.rules.packs.spec import Lifecycle, RulePack, RuleSpec
from advisor.rules.packs.validate import (
    PackError,
    PackInvalid,
    read_pack,
    validate_file,
)
from advisor.rules.packs.yamlsource import YamlSourceError, read_yaml

__all__ = [
    "ENTRY_POINT_GROUP",
    "RuleSet",
    "Selection",
    "builtin_pack",
    "load_pack",
    "load_rules",
    "pack_files",
    "plugin_packs",
]

ENTRY_POINT_GROUP = "advisor.rules"
BUILTIN_PACK = "builtin"  # a folder: one file per rule, named by its id, as its check is


def builtin_dir() -> Path:
    """rules/builtin: the built-in rules, one file each (rules/builtin/<id>.yaml, beside
    advisor/rules/checks/<id>.py in name)."""
    return rules_dir() / BUILTIN_PACK


def is_builtin_file(path: str | Path) -> bool:
    """Whether ``path`` is one of the built-in rules' files."""
    return Path(path).resolve().parent == builtin_dir().resolve()


@functools.lru_cache(maxsize=4)
def _builtin(stamps: tuple[tuple[str, int], ...]) -> RulePack:
    # Each file is its own pack named builtin; an id may be named (explains) in another file.
    files = [Path(name) for name, _ in stamps]
    known = _ids_in(files)
    packs = [read_pack(f, known_ids=known) for f in files]
    rules = [spec for pack in packs for spec in pack.rules]
    redirects = {old: new for pack in packs for old, new in pack.redirects.items()}
    pack = RulePack(pack="builtin", version=1, redirects=redirects, rules=rules)
    pack._source = str(builtin_dir())
    return pack


def _ids_in(files: list[Path]) -> set[str]:
    """The rule ids the files hold, read (as YAML data, nothing run) before the files are
    validated, so that each may name the others' (``explains``); a file that is not a pack
    gives none, and its own validation says why."""
    ids: set[str] = set()
    for file in files:
        try:
            data = read_yaml(file.read_text(encoding="utf-8")).data
        except (OSError, UnicodeDecodeError, YamlSourceError):
            continue
        rules = data.get("rules") if isinstance(data, dict) else None
        ids |= {str(r["id"]) for r in rules or [] if isinstance(r, dict) and "id" in r}
    return ids


def builtin_pack() -> RulePack:
    """The built-in rules (rules/builtin/*.yaml) as one pack, validated (read again only
    when a file changes)."""
    files = pack_files(builtin_dir())
    return _builtin(tuple((str(f), f.stat().st_mtime_ns) for f in files))


def _registered() -> set[str]:
    import advisor.rules.checks  # noqa: F401  (the built-in checks register on import)
    from advisor.rules.registry import registered

    return set(registered())


def load_pack(path: str | Path) -> RulePack:
    """A user's pack, validated as `advisor rules validate` does: its ``explains`` may name
    built-in rules, and a rule without a condition needs a registered Python check.
    Raises PackInvalid listing every problem."""
    builtin = builtin_pack()
    known = {s.id for s in builtin.rules} | set(builtin.redirects)
    pack = read_pack(path, known_ids=known, registered=_registered())
    clashes = [PackError(s._source, s._line, f"rule {s.id}: the id is already a built-in rule's")
               for s in pack.rules if s.id in known]
    if clashes and not is_builtin_file(path):
        raise PackInvalid(clashes)
    return pack


def pack_files(path: Path) -> list[Path]:
    """A pack file, or every .yaml / .yml file directly in a folder."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return [path]


def _pack_from(obj: object, name: str, known: set[str]) -> RulePack:
    if callable(obj) and not isinstance(obj, RulePack):
        obj = obj()
    if isinstance(obj, RulePack):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return read_pack(Path(obj), known_ids=known, registered=_registered())
    raise TypeError(f"it gave a {type(obj).__name__}, not a rule pack or a path to one")


def plugin_packs(known_ids: Iterable[str] = ()) -> tuple[list[tuple[str, RulePack]], list[str]]:
    """The packs of installed plugins, and a line for each plugin that was skipped."""
    packs: list[tuple[str, RulePack]] = []
    problems: list[str] = []
    known = set(known_ids)
    for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            pack = _pack_from(entry.load(), entry.name, known)
        except PackInvalid as exc:
            problems.append(f"rule plugin {entry.name} ({entry.value}) was skipped: its pack is invalid: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001  (someone else's package: report it, keep going)
            problems.append(f"rule plugin {entry.name} ({entry.value}) was skipped: "
                            f"{type(exc).__name__}: {exc}")
            continue
        packs.append((entry.name, pack))
        known.update(spec.id for spec in pack.rules)
    return packs, problems


@dataclass
class Selection:
    """The rules to run, as the configuration wants them."""

    specs: list[RuleSpec]
    disabled: set[str] = field(default_factory=set)
    enabled: set[str] = field(default_factory=set)
    preview: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class RuleSet:
    """Every loaded rule, where it came from, and the redirects of renamed ids."""

    specs: list[RuleSpec]
    origin: dict[str, str] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def resolve(self, rule_id: str) -> str | None:
        """The live id for ``rule_id``, following redirects; None where there is none."""
        ids = {s.id for s in self.specs}
        seen = set()
        while rule_id not in ids:
            if rule_id in seen or rule_id not in self.redirects:
                return None
            seen.add(rule_id)
            rule_id = self.redirects[rule_id]
        return rule_id

    def spec(self, rule_id: str) -> RuleSpec | None:
        live = self.resolve(rule_id)
        return next((s for s in self.specs if s.id == live), None)

    def configure(self, config: AdvisorConfig | None = None, *, preview: bool = False) -> Selection:
        """Apply ``config``: thresholds over the packs' own, disabled and enabled rules.
        An id or threshold it names that does not exist is an error (a typo would
        otherwise silently leave a gate open); a renamed id is followed, with a note."""
        config = config or AdvisorConfig()
        where = config.source or "configuration"
        notes: list[str] = []
        problems: list[str] = []

        def live(rule_id: str, key: str) -> str | None:
            resolved = self.resolve(rule_id)
            if resolved is None:
                close = [s.id for s in self.specs if s.id.split("-")[0] == rule_id.split("-")[0]][:3]
                problems.append(f"{key}: no rule {rule_id!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
            elif resolved != rule_id:
                notes.append(f"{where}: {key} names {rule_id}, which was renamed {resolved}; use the new id")
            return resolved

        disabled = {r for r in (live(i, "disable") for i in config.disable) if r}
        enabled = {r for r in (live(i, "enable") for i in config.enable) if r}
        overrides: dict[str, dict[str, float]] = {}
        for rule_id, values in config.thresholds.items():
            resolved = live(rule_id, f"thresholds.{rule_id}")
            if resolved is None:
                continue
            spec = self.spec(resolved)
            for name, value in values.items():
                if name not in spec.thresholds:
                    known = ", ".join(spec.thresholds) or "none"
                    problems.append(f"thresholds.{rule_id}: {resolved} has no threshold {name!r} (it has: {known})")
                    continue
                overrides.setdefault(resolved, {})[name] = float(value)
        if problems:
            raise ConfigInvalid(f"{where}: " + "; ".join(problems))
        specs = []
        for spec in self.specs:
            if spec.id in overrides:
                spec = spec.model_copy(update={"thresholds": {**spec.thresholds, **overrides[spec.id]}})
            specs.append(spec)
        for spec in specs:
            if spec.lifecycle is Lifecycle.deprecated and spec.id in enabled:
                notes.append(f"rule {spec.id} is deprecated and runs only because {where} enables it")
        return Selection(specs=specs, disabled=disabled, enabled=enabled,
                         preview=preview or config.preview, notes=notes)


def _add(ruleset: RuleSet, pack: RulePack, origin: str, *, fatal: bool) -> None:
    have = {s.id: s for s in ruleset.specs}
    clashes = []
    for spec in pack.rules:
        if spec.id in have:
            where = f"{ruleset.origin[spec.id]} pack" + (f" ({have[spec.id].source})" if have[spec.id].source else "")
            clashes.append((spec, f"rule {spec.id}: the id is already a rule of the {where}"))
        elif spec.id in ruleset.redirects:
            clashes.append((spec, f"rule {spec.id}: the id is a redirect to {ruleset.redirects[spec.id]}"))
    if clashes and fatal:
        raise PackInvalid([PackError(spec._source or origin, spec._line, message) for spec, message in clashes])
    if clashes:
        ruleset.problems.extend(f"rule plugin {origin}: {message}; skipped" for _, message in clashes)
    skip = {spec.id for spec, _ in clashes}
    for spec in pack.rules:
        if spec.id not in skip:
            ruleset.specs.append(spec)
            ruleset.origin[spec.id] = origin
    for old, new in pack.redirects.items():
        ruleset.redirects.setdefault(old, new)


def load_rules(packs: Sequence[Path] = (), *, config: AdvisorConfig | None = None,
               plugins: bool = True) -> RuleSet:
    """The built-in rules, the plugins' (unless ``plugins`` is False), the configured packs
    and ``packs``, in that order. Raises PackInvalid for an invalid pack the user named,
    listing every problem of every such pack."""
    builtin = builtin_pack()
    ruleset = RuleSet(specs=[])
    _add(ruleset, builtin, "builtin", fatal=True)
    if plugins:
        found, problems = plugin_packs({s.id for s in ruleset.specs})
        ruleset.problems.extend(problems)
        for name, pack in found:
            _add(ruleset, pack, name, fatal=False)
    paths = [*(config.pack_paths() if config else []), *packs]
    seen: set[Path] = set()
    errors: list[PackError] = []
    # The registered checks are imported (with pandas) only where a pack needs checking.
    registered = _registered() if paths else set()
    for path in paths:
        files = pack_files(path)
        if not files:
            errors.append(PackError(str(path), 0, "a folder with no .yaml rule packs in it"))
        for file in files:
            if file.resolve() in seen:
                continue
            seen.add(file.resolve())
            known = {s.id for s in ruleset.specs} | set(ruleset.redirects)
            pack, problems = validate_file(file, known_ids=known, registered=registered)
            if problems:
                errors.extend(problems)
                continue
            try:
                _add(ruleset, pack, pack.pack, fatal=True)
            except PackInvalid as exc:
                errors.extend(exc.errors)
    if errors:
        raise PackInvalid(errors)
    return ruleset
