"""The command-line side of rule packs: `advisor rules ...` and the options of `diagnose`
that choose the rules (``--rules``, ``--config``, ``--preview``).

    advisor rules list [--rules PACK]        every rule: id, severity, lifecycle, title, pack
    advisor rules show ID [--rules PACK]     a rule's documentation, thresholds, condition
    advisor rules validate PACK...           every problem of each pack, as FILE:LINE: message
    advisor rules new ID [--dir DIR]         a pack, a case and a test to start a rule from

advisor/cli.py adds these to its parser and calls :func:`rules_command` and
:func:`selection_for`; everything else about rules lives here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.errors import UsageError

# How many of a valid pack's rule ids `rules validate` names on its line.
_IDS_NAMED = 20

# Only the parser is built on every start of `advisor`; what loads rules (pydantic, pandas)
# is imported when a command needs it.
if TYPE_CHECKING:
    from advisor.rules.packs.catalog import RuleSet, Selection
    from advisor.rules.packs.config import AdvisorConfig
    from advisor.rules.packs.spec import RuleSpec

__all__ = ["add_rule_options", "add_rules_parser", "rules_command", "selection_for"]

VALIDATE_FAILED_EXIT = 1


def add_rule_options(parser: argparse.ArgumentParser, *, preview: bool = True) -> None:
    """--rules, --config (and --preview) for a command that loads rules."""
    parser.add_argument("--rules", action="append", type=Path, default=[], metavar="PACK",
                        help="a rule pack (YAML file, or a folder of them) to run beside the built-in "
                             "rules (repeatable)")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="advisor.toml or pyproject.toml to read settings from (default: advisor.toml "
                             "or pyproject.toml [tool.advisor] in the current folder, else the script's)")
    if preview:
        parser.add_argument("--preview", action="store_true", help="also run the rules in preview")


def add_rules_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    rules = sub.add_parser("rules", help="list, show, validate and start rules",
                           description="The rules: built-in, from plugins, and from your packs.")
    actions = rules.add_subparsers(dest="rules_command", metavar="ACTION")
    listing = actions.add_parser("list", help="list the rules")
    add_rule_options(listing, preview=False)
    show = actions.add_parser("show", help="show a rule's documentation")
    show.add_argument("rule_id", metavar="ID")
    add_rule_options(show, preview=False)
    validate = actions.add_parser("validate", help="check rule packs, listing every problem with its line")
    validate.add_argument("packs", nargs="+", type=Path, metavar="PACK")
    new = actions.add_parser("new", help="write a pack, a case and a test to start a new rule from")
    new.add_argument("rule_id", metavar="ID")
    new.add_argument("--dir", type=Path, default=Path("."), help="where to write them (default: here)")
    return rules


def _config_for(args: argparse.Namespace, script: Path | None = None) -> AdvisorConfig:
    from advisor.rules.packs.config import find_config, load_config

    explicit = getattr(args, "config", None)
    if explicit is not None:
        return load_config(explicit)
    folders = [Path.cwd()] + ([script.resolve().parent] if script is not None else [])
    return load_config(find_config(folders))


def _ruleset(args: argparse.Namespace, script: Path | None = None,
             said: list[str] | None = None) -> tuple[RuleSet, AdvisorConfig]:
    from advisor.rules.packs.catalog import load_rules

    config = _config_for(args, script)
    ruleset = load_rules(list(getattr(args, "rules", []) or []), config=config)
    for problem in ruleset.problems:
        _say(problem, said)
    return ruleset, config


def selection_for(args: argparse.Namespace, script: Path | None = None,
                  said: list[str] | None = None) -> tuple[Selection, AdvisorConfig]:
    """The rules `diagnose` runs, and the configuration they came with; notes (renamed
    ids, deprecated rules) and skipped plugins go to stderr, and to ``said`` where given."""
    ruleset, config = _ruleset(args, script, said)
    selection = ruleset.configure(config, preview=bool(getattr(args, "preview", False)))
    for note in selection.notes:
        _say(note, said)
    return selection, config


def _say(line: str, said: list[str] | None) -> None:
    print(f"advisor: {line}", file=sys.stderr)
    if said is not None:
        said.append(line)


def _list(args: argparse.Namespace) -> int:
    ruleset, _ = _ruleset(args)
    specs = ruleset.specs
    width = max(len(s.id) for s in specs)
    for spec in specs:
        print(f"{spec.id:<{width}}  {spec.severity.value:<8} {spec.lifecycle.value:<10} {spec.title}"
              f"  [{ruleset.origin.get(spec.id, '')}]")
    return 0


def _show_data_rule(spec: RuleSpec) -> None:
    print("## Condition")
    print(f"  table: {spec.table}")
    print(f"  when: {' '.join(spec.condition.split())}")
    for level in spec.escalate:
        print(f"  {level.severity.value} when: {' '.join(level.when.split())}")
    for name, ref in spec.values.items():
        print(f"  @{name} = {ref.table}[{ref.row!r}].{ref.column}")
    if spec.saving is not None:
        print(f"  saving per step (ns): {' '.join(spec.saving.ns_per_step.split())}")
    print()


def _show(args: argparse.Namespace) -> int:
    ruleset, config = _ruleset(args)
    spec = ruleset.spec(args.rule_id)
    if spec is None:
        raise UsageError(f"no rule with id {args.rule_id!r}; `advisor rules list` lists them")
    configured = next(s for s in ruleset.configure(config).specs if s.id == spec.id)
    print(f"{spec.id}: {spec.title}\n")
    if spec.id != args.rule_id:
        print(f"({args.rule_id} was renamed {spec.id}.)\n")
    about = [f"severity {spec.severity.value}", spec.lifecycle.value, f"pack {ruleset.origin.get(spec.id, '')}"]
    if spec.source:
        about.append(spec.source)
    print(", ".join(about) + "\n")
    for heading, text in (("What it does", spec.docs.what), ("Why it matters", spec.docs.why),
                          ("Example", spec.docs.example), ("Use instead", spec.docs.instead)):
        print(f"## {heading}\n{text.rstrip()}\n")
    if spec.is_data_rule:
        _show_data_rule(spec)
    if spec.thresholds:
        print("## Options")
        for name, value in configured.thresholds.items():
            mine = f"  (set in {config.source}; the pack says {spec.thresholds[name]:g})" \
                if value != spec.thresholds[name] else ""
            print(f"  {name} = {value:g}{mine}")
        print(f"\n  (override in advisor.toml: [thresholds.{spec.id}] {next(iter(spec.thresholds))} = ...)")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from advisor.rules.engine import checks
    from advisor.rules.packs.catalog import builtin_pack, is_builtin_file, pack_files, plugin_packs
    from advisor.rules.packs.validate import PackError, validate_file

    builtin = builtin_pack()
    plugins, problems = plugin_packs({s.id for s in builtin.rules})
    for problem in problems:
        print(f"advisor: {problem}", file=sys.stderr)
    taken = {s.id: "built-in" for s in builtin.rules}
    for name, pack in plugins:
        taken.update({s.id: f"plugin {name}" for s in pack.rules})
    known = set(taken) | set(builtin.redirects)
    registered = set(checks())
    failed = 0
    for path in args.packs:
        files = pack_files(path)
        if not files:
            print(f"{path}: a folder with no .yaml rule packs in it")
            failed += 1
        for file in files:
            pack, errors = validate_file(file, known_ids=known, registered=registered)
            if pack is not None and not is_builtin_file(file):  # the built-in rules' files may be checked too
                errors = [PackError(s._source, s._line, f"rule {s.id}: the id is already a {taken[s.id]} rule's")
                          for s in pack.rules if s.id in taken]
            for error in errors:
                print(error)
            if errors:
                failed += 1
                continue
            ids = [s.id for s in pack.rules]
            # A large pack's ids are named in part: `advisor rules list --rules PACK` lists them all.
            named = ", ".join(ids[:_IDS_NAMED])
            if len(ids) > _IDS_NAMED:
                named += f" and {len(ids) - _IDS_NAMED} more"
            print(f"{pack.source}: ok, {len(ids)} rule{'s' if len(ids) != 1 else ''} ({named})")
            known |= {s.id for s in pack.rules}
    if failed:
        print(f"advisor: {failed} rule pack{'s' if failed > 1 else ''} with problems", file=sys.stderr)
        return VALIDATE_FAILED_EXIT
    return 0


def _new(args: argparse.Namespace) -> int:
    from advisor.cli.scaffold import write_scaffold
    from advisor.rules.packs.catalog import builtin_pack

    taken = {s.id for s in builtin_pack().rules}
    written = write_scaffold(args.rule_id, args.dir, taken=taken)
    for path in (written.pack, written.case, written.test):
        print(f"wrote {path}")
    print(f"\nNext: edit {written.pack}, check it with `advisor rules validate {written.pack}`, record "
          f"the case with the command in {written.case}, then run `pytest {written.test}`.")
    return 0


def rules_command(args: argparse.Namespace) -> int:
    """`advisor rules ACTION`."""
    action = args.rules_command or "list"
    if action == "list":
        if not hasattr(args, "rules"):
            args.rules, args.config = [], None
        return _list(args)
    return {"show": _show, "validate": _validate, "new": _new}[action](args)
