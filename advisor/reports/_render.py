"""One entry point for every report format: ``render(report, fmt, out, console)``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.errors import UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from advisor.reports.report import Report

__all__ = ["FORMATS", "render", "shown_safely"]

FORMATS = ("terminal", "json", "markdown", "html")

# A terminal report written to a file has no terminal to measure.
FILE_WIDTH = 100


def render(report: Report, fmt: str, out: Path | str | None = None, console: Console | None = None,
           *, progress: Callable[[int, int], None] | None = None) -> None:
    """Render ``report`` as ``fmt`` ("terminal", "json", "markdown" or "html").

    With ``out`` the text goes to that file (a terminal report without colour, at width
    100); otherwise to ``console`` (or standard output). An unknown format, or a file that
    cannot be written, raises UsageError. ``progress(done, total)`` hears of the HTML
    report's sections as they are rendered.
    """
    if fmt not in FORMATS:
        raise UsageError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt != "json":  # JSON escapes control characters itself
        report = shown_safely(report)
    # Each format's renderer is imported when it is asked for (the HTML one is the heaviest).
    if fmt == "terminal" and out is None:
        from advisor.reports._terminal import render_terminal

        render_terminal(report, console if console is not None else _stdout_console())
        return
    if fmt == "terminal":
        from advisor.reports._terminal import terminal_text

        text = terminal_text(report, width=FILE_WIDTH)
    elif fmt == "json":
        from advisor.reports._json import render_json

        text = render_json(report)
    elif fmt == "html":
        from advisor.reports._html import render_html

        text = render_html(report, progress=progress)
    else:
        from advisor.reports._markdown import render_markdown

        text = render_markdown(report)
    write_text(text, out, console, what="the report")


def shown_safely(report: Report) -> Report:
    """The report with every text from the trace or session (names, sources, messages,
    table cells) written with its control characters escaped, for a terminal, Markdown or
    HTML reader: an op named with an escape sequence sets no window title and writes no
    clipboard."""
    from advisor.units import safe_strings

    dumped = report.model_dump()
    cleaned = safe_strings(dumped)
    return report if cleaned == dumped else type(report).model_validate(cleaned)


def _stdout_console() -> Console:
    """A console on standard output whose closed pipe (`advisor ... | head`) is a
    BrokenPipeError for the command to handle, not rich's own SystemExit(1)."""
    from rich.console import Console

    class _PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _PipeConsole()


def write_text(text: str, out: Path | str | None, console: Console | None, *, what: str) -> None:
    """Write rendered ``text`` to ``out`` (creating its folder), else to ``console`` or
    standard output; a file that cannot be written is a UsageError naming ``what``."""
    if out is None:
        stream = console.file if console is not None else sys.stdout
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:  # the reader stopped reading (`| head`): the caller decides
            raise
        except OSError as exc:  # a full disk behind a redirect: what was written is not whole
            raise UsageError(f"cannot write {what} to standard output: {exc.strerror or exc}; what was written "
                             "is cut short") from None
        return
    path = Path(out)
    if not path.is_file() and path.exists():  # a device or pipe (/dev/stdout): written as it is
        path.write_text(text, encoding="utf-8")
        return
    # Written aside and renamed into place: a full disk leaves no half-written report (and
    # no empty one over a previous report of the same name).
    aside = path.with_name(f".{path.name}.advisor-partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        aside.write_text(text, encoding="utf-8")
        os.replace(aside, path)
    except OSError as exc:
        try:
            aside.unlink(missing_ok=True)
        except OSError:  # its folder is no folder: nothing was written
            pass
        raise UsageError(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
