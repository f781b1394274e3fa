"""The exceptions advisor raises on bad input, in one hierarchy.

    AdvisorError                 anything the CLI turns into one line and a non-zero exit
    ├── TraceError               a trace file that cannot be read (corrupt, truncated, empty,
    │                            binary, an unknown format, the wrong shape)
    ├── SessionError             a path that is not a saved session, or a damaged one
    ├── ScriptError              a script that does not exist or cannot be run
    ├── RulePackError            a rule pack that does not validate
    └── UsageError               options that do not fit together

The CLI catches AdvisorError and prints ``advisor: <message>`` on stderr; anything else
that escapes is a bug in advisor, not in the user's input.
"""

from __future__ import annotations


class AdvisorError(Exception):
    """Base class: a problem with the user's input, reported as one line."""

    exit_code = 2


class TraceError(AdvisorError):
    """A trace file that cannot be read."""


class SessionError(AdvisorError):
    """A path that is not a saved advisor session."""


class ScriptError(AdvisorError):
    """A user script that does not exist or cannot be started."""


class RulePackError(AdvisorError):
    """A rule pack that does not validate."""


class UsageError(AdvisorError):
    """Command-line options that do not fit together."""
