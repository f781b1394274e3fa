"""advisor: a performance advisor for deep-learning jobs.

Collect a profile (run a script, or read a trace another profiler wrote), summarise it in
tables, run rules over the tables, and report ranked findings with their evidence.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
