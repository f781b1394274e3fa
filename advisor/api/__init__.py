"""advisor from Python and from coding agents, beside the command line.

    target       a trace, saved session or job diagnosed for such a caller (no script runs)
    notebook     ``advisor.diagnose(target)``: a Diagnosis shown inline in a notebook, with
                 its findings, its tables as DataFrames and its JSON report
    mcp_server   `advisor mcp`: diagnose, summary, compare, explain and verify as Model Context
                 Protocol tools on stdio (the official `mcp` SDK, ``advisor[mcp]``)
    mcp_verify   the MCP verify tool's run of `advisor verify`: bounded in time, cancellable,
                 ended with every process it started
"""
