"""The version of advisor, in one place: the package, the wheel and the reports read it."""

__version__ = "0.1.0"
