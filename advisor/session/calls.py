"""What the host's runtime and driver calls are, by name: CUDA and HIP alike.

A trace names the calls the host made into the GPU runtime (``cudaLaunchKernel``,
``hipGraphLaunch``, ``cuModuleLoadData``...). Which of them launch work, replay a graph,
block until the device catches up, set the device up or capture a graph is what the step
model, the tables and the rules ask of them; the answer is written once, here, for both
vendors' spellings (ROCm's runtime mirrors CUDA's names with ``hip`` for ``cuda``).
"""

from __future__ import annotations

import re

__all__ = [
    "BLOCKING_CALLS",
    "CAPTURE_CALLS",
    "CAPTURE_FRAMES",
    "COMPILE_FRAMES",
    "CONTEXT_CALLS",
    "EVENT_SYNC",
    "DEVICE_SYNC",
    "GRAPH_LAUNCH",
    "HOST_BLOCKING_PREFIXES",
    "LAUNCH_CALLS",
    "MODULE_CALLS",
    "STREAM_SYNC",
    "STREAM_WAIT",
    "SYNC_COPY",
]

# One kernel per call, or a graph of them.
LAUNCH_CALLS = re.compile(
    r"^(cuda|hip)(LaunchKernel|LaunchCooperativeKernel|ExtLaunchKernel|ExtModuleLaunchKernel|ModuleLaunchKernel"
    r"|GraphLaunch)|^cu(LaunchKernel|LaunchKernelEx|LaunchCooperativeKernel|GraphLaunch)|^hipExtLaunch")
GRAPH_LAUNCH = re.compile(r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)")

# Calls that return only once the device has caught up.
SYNC_COPY = re.compile(r"^(cuda|cu|hip)Memcpy(?!.*Async)")
STREAM_SYNC = re.compile(r"^(cudaStreamSynchronize|cuStreamSynchronize|hipStreamSynchronize)")
DEVICE_SYNC = re.compile(r"^(cudaDeviceSynchronize|cuCtxSynchronize|hipDeviceSynchronize)")
EVENT_SYNC = re.compile(r"^(cudaEventSynchronize|cuEventSynchronize|hipEventSynchronize)")
BLOCKING_CALLS = (SYNC_COPY, STREAM_SYNC, DEVICE_SYNC, EVENT_SYNC)
# The same, as name prefixes, for the attribution stage's quick test.
HOST_BLOCKING_PREFIXES = ("cudaMemcpy", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "hipMemcpy", "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize")

# Cross-stream order: a stream waiting for an event recorded on another.
STREAM_WAIT = re.compile(r"^(cudaStreamWaitEvent|cuStreamWaitEvent|hipStreamWaitEvent)")

# Setting the device up: the context, the first allocation that creates it, and loading
# kernel modules (lazy loading does it inside the first launch of each kernel).
CONTEXT_CALLS = re.compile(
    r"^(cuInit|cuDevicePrimaryCtxRetain|cuCtxCreate|cudaSetDevice|cudaGetDeviceCount|cudaDeviceReset|hipInit"
    r"|hipSetDevice|hipGetDeviceCount|hipDeviceReset|cudaFree$|hipFree$|cudaDeviceGetStreamPriorityRange)")
MODULE_CALLS = re.compile(r"^(cuModuleLoad|cuLibraryLoad|cuModuleGetFunction|cuLibraryGetKernel|hipModuleLoad"
                          r"|hipModuleGetFunction|cudaGetFuncBySymbol|__hipRegisterFatBinary|__cudaRegisterFatBinary)")

# Recording a graph rather than running work: stream capture and instantiation.
CAPTURE_CALLS = re.compile(
    r"^(cuda|hip)(StreamBeginCapture|StreamEndCapture|GraphInstantiate|GraphUpload|ThreadExchangeStreamCaptureMode)"
    r"|^cu(StreamBeginCapture|StreamEndCapture|GraphInstantiate|GraphUpload)")

# Python frames of compilation (torch.compile's Dynamo and Inductor, Triton's compiler):
# start-up, not steady work. Matched by file and function: the same files hold the code
# that runs compiled graphs at every step.
COMPILE_FRAMES = re.compile(
    r"(_dynamo/convert_frame|_inductor/compile_fx|_inductor/graph|_inductor/codecache|_inductor/async_compile"
    r"|triton/compiler/compiler)\.py\(\d+\): (_compile|compile_inner|_convert_frame\w*|compile_fx\w*|_compile_fx\w*"
    r"|fx_codegen_and_compile|codegen_and_compile|compile_to_module|compile|wait)$"
    r"|^(compile_fx_inner|inductor_compile|dynamo_compile|TorchDynamo compile)"
    # torch.compile's own ranges where a profiler records (dynamo_timed), and advisor's mark
    # of each compilation (advisor.collect.hooks.compiles).
    r"| \(dynamo_timed\)$|^advisor::compile ")
# Python frames of graph capture (torch.cuda.graphs, Inductor's CUDA graph trees, and
# the capture loops of serving engines built on them), and of warm-up passes named so
# (a framework's warmup before capture or timing): start-up, not steady work.
CAPTURE_FRAMES = re.compile(
    r"cuda/graphs\.py\(\d+\): (capture_begin|capture_end|make_graphed_callables)"
    r"|cudagraph_trees\.py\(\d+\): (_record|record_function|warmup|_warmup\w*)$"
    r"|\(\d+\): (capture\w*|\w*_capture|\w*capture_graph\w*|\w*warmup\w*|\w*warm_up\w*)$")
