"""Knowledge: what the rules and tables reason with besides the profile itself.

    hardware    GPU profiles and tensor-core rules read from knowledge/ (the data folder),
                device matching, peaks by unit and dtype, wave quantization
    costs/      op cost models: FLOPs and bytes from recorded shapes and dtypes
    roofline    the target an op is judged against (--gpu, the session's GPU, or this
                machine's calibrated CPU) and its two ceilings
    calibrate   `advisor calibrate`: measure this machine's peaks and keep them
    cpu         what a CPU's flags say of each dtype (native bf16 or not), and whether a
                calibration's peaks hold for this machine (whose, when, under what load)

The names below are the hardware knowledge base's (``from advisor.knowledge import
gpu_profile``); the other modules are imported by name.
"""

from advisor.knowledge.hardware import (
    FIGURE_GROUPS,
    DeviceMatch,
    GpuProfile,
    KernelClass,
    KnowledgeBase,
    KnowledgeError,
    Source,
    TensorCoreOp,
    TensorCoreRule,
    WaveQuantization,
    classify_kernel,
    device_match,
    gpu_profile,
    gpu_profiles,
    knowledge,
    load_knowledge,
    match_device,
    memory_bandwidth,
    normalize_dtype,
    peak_flops,
    tensor_core_op,
    tensor_core_rule,
    uses_tensor_cores,
    wave_quantization,
)

__all__ = [
    "FIGURE_GROUPS",
    "DeviceMatch",
    "GpuProfile",
    "KernelClass",
    "KnowledgeBase",
    "KnowledgeError",
    "Source",
    "TensorCoreOp",
    "TensorCoreRule",
    "WaveQuantization",
    "classify_kernel",
    "device_match",
    "gpu_profile",
    "gpu_profiles",
    "knowledge",
    "load_knowledge",
    "match_device",
    "memory_bandwidth",
    "normalize_dtype",
    "peak_flops",
    "tensor_core_op",
    "tensor_core_rule",
    "uses_tensor_cores",
    "wave_quantization",
]
