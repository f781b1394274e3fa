"""`python -m advisor` is the `advisor` command."""

import sys

from advisor.cli import main

sys.exit(main())
