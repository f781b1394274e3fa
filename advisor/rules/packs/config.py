"""The user's advisor configuration: ``advisor.toml``, or ``[tool.advisor]`` in
``pyproject.toml``.

    # advisor.toml (in pyproject.toml the same keys go under [tool.advisor])
    packs = ["perf-rules/team.yaml"]       # rule packs to run beside the built-in rules
    disable = ["low-gpu-utilization"]      # rules not to run
    enable = ["some-preview-rule"]         # preview or deprecated rules to run
    preview = false                        # run every preview rule
    fail_on = "high"                       # as --fail-on, when the command line gives none

    [thresholds.dataloader-starvation]     # [tool.advisor.thresholds.dataloader-starvation]
    dataloader_share = 0.2

Where it is looked for: ``--config FILE`` if given; else the current folder, then the
script's folder (for ``advisor diagnose train.py``): in each, ``advisor.toml`` first, then a
``pyproject.toml`` that has a ``[tool.advisor]`` table. The first found is used; relative
pack paths are relative to its folder. Rule ids and threshold names are checked once the
rules are loaded (see :meth:`advisor.rules.packs.catalog.RuleSet.configure`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from advisor.errors import UsageError
from advisor.paths import special_file
from advisor.findings import Severity
from advisor.rules.packs.spec import Number

__all__ = ["AdvisorConfig", "ConfigInvalid", "find_config", "load_config"]

CONFIG_NAMES = ("advisor.toml", "pyproject.toml")


class ConfigInvalid(UsageError):
    """A configuration file that cannot be read or does not validate."""


class AdvisorConfig(BaseModel):
    """What a configuration file may say."""

    model_config = ConfigDict(extra="forbid")

    packs: list[str] = Field(default_factory=list, description="Rule packs (files or folders) to add.")
    disable: list[str] = Field(default_factory=list, description="Rule ids not to run.")
    enable: list[str] = Field(default_factory=list, description="Preview or deprecated rule ids to run.")
    preview: bool = Field(default=False, description="Run every preview rule.")
    fail_on: Severity | None = Field(default=None, description="As --fail-on, where the command line gives none.")
    thresholds: dict[str, dict[str, Number]] = Field(
        default_factory=dict, description="Rule id -> {threshold name: value}, over the packs' own."
    )

    _source: str = PrivateAttr(default="")
    _base: Path = PrivateAttr(default_factory=Path.cwd)

    @property
    def source(self) -> str:
        """The file it came from ('' for the defaults)."""
        return self._source

    def pack_paths(self) -> list[Path]:
        """The configured packs, relative paths taken from the config file's folder."""
        return [p if p.is_absolute() else self._base / p for p in (Path(s).expanduser() for s in self.packs)]


def _read_toml(path: Path) -> dict[str, Any]:
    # Imported here, where a file is found: tomllib compiles its patterns on import (0.1 s),
    # which a command without a configuration file would wait for.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    special = special_file(path)  # a found advisor.toml that is a FIFO: refused, not read
    if special is not None:
        raise ConfigInvalid(f"{path}: is {special}, not a configuration file")
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigInvalid(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _section(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The advisor settings in ``path`` (None where a pyproject.toml has none) and how
    messages should name where they are."""
    data = _read_toml(path)
    if path.name == "pyproject.toml":
        tool = data.get("tool")
        section = tool.get("advisor") if isinstance(tool, dict) else None
        if section is not None and not isinstance(section, dict):
            raise ConfigInvalid(f"{path}: [tool.advisor] must be a table")
        return section, f"{path} [tool.advisor]"
    return data, str(path)


def find_config(folders: Iterable[Path]) -> Path | None:
    """The first ``advisor.toml`` or pyproject.toml with [tool.advisor] in ``folders``."""
    seen: set[Path] = set()
    for folder in folders:
        folder = Path(folder).resolve()
        if folder in seen:
            continue
        seen.add(folder)
        for name in CONFIG_NAMES:
            candidate = folder / name
            if not candidate.is_file():
                continue
            if name == "pyproject.toml" and _section(candidate)[0] is None:
                continue
            return candidate
    return None


def load_config(path: Path | None) -> AdvisorConfig:
    """The configuration in ``path`` (the defaults where ``path`` is None)."""
    if path is None:
        return AdvisorConfig()
    path = Path(path)
    special = special_file(path)
    if special is not None:
        raise ConfigInvalid(f"{path}: is {special}, not a configuration file")
    if not path.is_file():
        raise ConfigInvalid(f"{path}: no such configuration file")
    section, where = _section(path)
    if section is None:
        raise ConfigInvalid(f"{where}: not found in {path}")
    try:
        config = AdvisorConfig.model_validate(section)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key {field!r} (the keys are: {', '.join(AdvisorConfig.model_fields)})")
            else:
                problems.append(f"{field}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigInvalid(f"{where}: " + "; ".join(problems)) from None
    config._source = where
    config._base = path.resolve().parent
    return config
