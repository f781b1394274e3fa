"""`python -m advisor` is the `advisor` command."""

from advisor.cli import console_main

console_main()
