"""``advisor verify``: run the advice and measure it.

    fixes   the fixes advisor can apply from outside a script, and how a rule's pack names them
    trial   one run of the script, a fix applied or none, its steps timed (a process of its own)
    run     the trials for each finding, alternating with runs without the fix, until the
            difference is clear of the noise or the budget is spent
    processes  a command that runs the script (a trial; verify itself, from the MCP server)
            started in a session of its own, and ended whole with what it started
    ledger  every measured fix beside its promise, kept on disk; `advisor ledger` sums it up per rule
"""
