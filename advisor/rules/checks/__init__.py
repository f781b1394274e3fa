"""The code of the built-in rules, one module per rule; importing this package registers
them with the engine. Each check reads tables through its RuleContext and returns
findings; thresholds come from the rule's spec in rules/builtin.yaml."""

from advisor.rules.checks import (  # noqa: F401
    collection,
    communication,
    conv_bias,
    fresh_copies,
    host_bound,
    host_sync,
    launch_bound,
    loader,
    optimizer,
    per_sample,
    roofline,
    straggler,
    tensor_cores,
    utilization,
)
