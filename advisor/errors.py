"""The exceptions advisor raises on bad input, in one hierarchy.

    AdvisorError                 anything the CLI turns into one line and a non-zero exit
    ├── TraceError               a trace file that cannot be read (corrupt, truncated, empty,
    │                            binary, an unknown format, the wrong shape)
    ├── SessionError             a path that is not a saved session, or a damaged one
    ├── ScriptError              a script that does not exist or cannot be run
    ├── RulePackError            a rule pack that does not validate
    └── UsageError               options that do not fit together

``Stopped`` is not an error: SIGTERM or SIGHUP (a batch scheduler's end of a job, a closed
terminal) raised as a KeyboardInterrupt, so that what Ctrl-C keeps it keeps too.

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


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP received: handled as Ctrl-C is, with the signal's exit code."""

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process ended by the signal
