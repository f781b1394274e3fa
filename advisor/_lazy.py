"""Names a package exports without importing the modules that define them until first use.

Building the command line's parser, or `advisor --help`, must not load pandas and
pydantic; a package whose public names live in heavier modules declares them here:

    __getattr__, __dir__ = lazy_exports(__name__, {"run_rules": "engine", ...})

``from advisor.rules import run_rules`` then imports ``advisor.rules.engine`` at that
moment, once.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``package`` that resolve each name of
    ``exports`` (name -> submodule) on first use."""
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        submodule = exports.get(name)
        if submodule is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{submodule}"), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *exports})

    return __getattr__, __dir__
