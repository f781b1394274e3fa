"""The code of the built-in rules, one module per rule, named after its id; importing this
package registers them with the engine. Each check reads the tables and the step model
through its RuleContext and returns findings, in three parts where the rule has them:
measure (the figures), decide (whether it fires, and which fix holds) and word (the
finding); thresholds come from the rule's spec in rules/builtin.yaml. ``common`` holds the
helpers they share."""

from advisor.rules.checks import (  # noqa: F401
    autograd_anomaly_detection,
    autograd_in_inference,
    batch_loop_in_model,
    below_roofline,
    communication_not_overlapped,
    conv_bias_before_batchnorm,
    cpu_dtype_speed,
    cpu_threads_oversubscribed,
    cpu_tensor_copied_each_step,
    dataloader_starvation,
    grad_zeroing_memsets,
    host_bound,
    launch_bound,
    low_gpu_utilization,
    not_steady_state,
    optimizer_not_fused,
    per_sample_model_calls,
    periodic_step_work,
    profile_incomplete,
    queued_work_waits,
    straggler_rank,
    sync_memcpy_stall,
    tensor_core_misalignment,
)
