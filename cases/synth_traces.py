"""Write the planted cases' synthetic traces: Kineto Chrome-trace JSON, made here event by
event, each with one pattern the step model must recognise.

Real traces of these patterns exist only on GPUs this project cannot run (a context made
at start-up, a graph being captured, a stream waiting on another), so each is built the
way torch.profiler writes one (categories, ``args`` with correlation and External id,
microsecond timestamps) with a known answer, and read through advisor's own importer like
any trace a user brings. Each case folder holds the trace (``trace.json.gz``) beside its
case.yaml; this script writes them again, byte for byte:

    python cases/synth_traces.py            # every synthetic case's trace
    python cases/synth_traces.py --check    # exit 1 where a committed trace differs

    synth_startup             context creation and module loading before a steady loop
    synth_capture             a serving engine capturing graphs: all warm-up, no steady step
    synth_in_flight           the first work waits 400 ms behind work launched before the trace
    synth_no_steps_loader     a training loop with no ProfilerStep whose DataLoader starves it
    synth_queued_stream       work queued on one stream behind another stream's long kernel
    synth_nested_preprocess   an inference pipeline decoding and normalising in nested Python
                              frames between model calls
    synth_range_mode          a GPU training loop recorded with launches but no GPU activity
    synth_merged_ranks        a two-rank job merged into one file (TraceFusion's layout), rank 1
                              late at every all-reduce
    synth_warmup_second_call  a TorchScript function whose second call spends 296 ms being
                              optimised, once, in a GPU-bound inference loop
    synth_one_cold_pass       one cold forward pass: a 1.34 s first cuDNN launch, then the pass
    synth_module_steps_vs_syncs  a decode loop without ProfilerStep whose most frequent module
                              call (a logits processor, 1-4 a step) is not a step; the syncs are
    synth_wrapped_training    a training loop wrapped whole, backward on autograd's busier thread,
                              no ProfilerStep: the optimizer steps are the iterations
    synth_compiled_iterations three compiled iterations, the first compiling (43.5 ms of 53.6)
    synth_gemm_benchmark      one misaligned GEMM called twelve times after 600 ms of set-up
    synth_serving_syncs       a decode loop without stacks, one synchronize an engine step
    synth_one_pass_layers     one forward pass of twelve identical layers and a large head
    synth_sync_benchmark      an attention benchmark synchronizing after each call
    synth_rocm_*              AMD Instinct micro-benchmarks (MI300X, MI250X): a misaligned bf16
                              GEMM, a GEMM of few tiles, a memory-bound add, attention far below
                              its roofline
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

CASES_DIR = Path(__file__).resolve().parent
PID, TID, GPU = 4242, 4242, 0
DEVICE = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_899_345_920, "computeMajor": 8,
          "computeMinor": 0, "numSms": 108}


# AMD Instinct devices as ROCm's Kineto writes them: the GFXIP version in the CUDA-named
# fields, compute units as numSms, a 64-wide wavefront. An MI250X GCD is its own device.
MI300X = {"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 206_141_652_992, "computeMajor": 9,
          "computeMinor": 4, "warpSize": 64, "numSms": 304, "maxThreadsPerBlock": 1024}
MI250X = {"id": 0, "name": "AMD Instinct MI250X", "totalGlobalMem": 68_702_699_520, "computeMajor": 9,
          "computeMinor": 0, "warpSize": 64, "numSms": 110, "maxThreadsPerBlock": 1024}


class Trace:
    """Events in Kineto's spelling; times in microseconds from the trace's start."""

    def __init__(self, device: dict | None = None) -> None:
        self.device = device or DEVICE
        self.events: list[dict] = []
        self.correlation = 1000
        self.external = 1

    def host(self, name: str, cat: str, ts: float, dur: float, *, tid: int = TID, **args) -> dict:
        event = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": round(ts, 3),
                 "dur": round(dur, 3), "args": {"External id": self.external, **args}}
        self.external += 1
        self.events.append(event)
        return event

    def op(self, name: str, ts: float, dur: float, *, tid: int = TID, **args) -> dict:
        return self.host(name, "cpu_op", ts, dur, tid=tid, **args)

    def python(self, name: str, ts: float, dur: float, *, tid: int = TID) -> dict:
        return self.host(name, "python_function", ts, dur, tid=tid)

    def annotation(self, name: str, ts: float, dur: float, *, tid: int = TID) -> dict:
        return self.host(name, "user_annotation", ts, dur, tid=tid)

    def runtime(self, name: str, ts: float, dur: float, *, tid: int = TID) -> int:
        """A runtime call (HIP's on ROCm: Kineto files them as cuda_runtime too); its
        correlation id, for the GPU work it launches."""
        self.correlation += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid,
                            "ts": round(ts, 3), "dur": round(dur, 3),
                            "args": {"correlation": self.correlation, "External id": self.external}})
        return self.correlation

    def kernel(self, name: str, ts: float, dur: float, correlation: int | None, *, stream: int = 7) -> None:
        args = {"device": GPU, "stream": stream, "correlation": correlation if correlation is not None else -1,
                "grid": [80, 1, 1], "block": [256, 1, 1]}
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": GPU, "tid": stream,
                            "ts": round(ts, 3), "dur": round(dur, 3), "args": args})

    def copy(self, ts: float, dur: float, correlation: int, nbytes: int, *, stream: int = 7) -> None:
        """A copy from pageable host memory to the device, launched by ``correlation``."""
        self.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": GPU,
                            "tid": stream, "ts": round(ts, 3), "dur": dur,
                            "args": {"device": GPU, "stream": stream, "correlation": correlation, "bytes": nbytes}})

    def launch(self, ts: float, name: str, kernel_start: float, kernel_dur: float, *, call_us: float = 5.0,
               stream: int = 7, op: str = "aten::add", tid: int = TID, **args) -> float:
        """An operator launching one kernel: the op, its launch call, the kernel; returns
        when the op ends."""
        self.op(op, ts, call_us + 4, tid=tid, **args)
        correlation = self.runtime("cudaLaunchKernel", ts + 2, call_us, tid=tid)
        self.kernel(name, kernel_start, kernel_dur, correlation, stream=stream)
        return ts + call_us + 4

    def write(self, path: Path) -> bytes:
        doc = {"schemaVersion": 1, "deviceProperties": [self.device], "traceEvents": self.events,
               "traceName": path.parent.name}
        text = json.dumps(doc, indent=None, separators=(",", ":"), sort_keys=True).encode()
        return gzip.compress(text, mtime=0)


def steady_gpu_loop(t: Trace, start: float, iterations: int, *, kernels: int = 20, kernel_us: float = 400.0) -> float:
    """A GPU-bound loop: each iteration's kernels are long (``kernel_us``) and launched well
    ahead, the host waiting for the device once an iteration. Returns its end."""
    now, gpu = start, start
    for _ in range(iterations):
        for k in range(kernels):
            gpu = max(gpu, now + 8) + kernel_us
            now = t.launch(now, f"ampere_sgemm_128x64_nn_{k % 3}", gpu - kernel_us, kernel_us)
        sync = t.runtime("cudaDeviceSynchronize", now, max(gpu - now, 1.0) + 3)
        del sync
        now = max(gpu, now) + 5
    return now


def synth_startup() -> Trace:
    """The CUDA context made by the first cudaFree (800 ms), kernel modules loaded, a first
    launch that loads its module lazily (60 ms), then a steady GPU-bound loop of 30 ms."""
    t = Trace()
    t.runtime("cudaGetDeviceCount", 0, 30)
    t.runtime("cudaFree", 40, 800_000)
    t.runtime("cuModuleLoadData", 800_100, 25_000)
    t.runtime("cuModuleGetFunction", 825_200, 10)
    first = t.runtime("cudaLaunchKernel", 825_300, 60_000)
    t.kernel("vectorized_elementwise_kernel", 885_310, 5, first)
    steady_gpu_loop(t, 890_000, 6)
    return t


def synth_capture() -> Trace:
    """A serving engine's warm-up: for each batch size an eager warm-up run, then the same
    launches captured into a graph and instantiated; the captured launches run nothing."""
    t = Trace()
    now = 0.0
    for batch in (1, 2, 4, 8, 16, 32):
        frame = t.python("sglang/srt/model_executor/cuda_graph_runner.py(300): capture_one_batch_size", now, 0)
        begin = now
        for k in range(10):  # warm-up: eager, short kernels
            now = t.launch(now, f"fused_moe_kernel_{k}", now + 12, 4)
        now += 50
        t.runtime("cudaStreamBeginCapture", now, 20)
        now += 30
        for k in range(300):  # captured: launch calls, no kernels
            t.op("aten::mm", now, 30)
            t.runtime("cudaLaunchKernel", now + 5, 20)
            now += 40
        t.runtime("cudaStreamEndCapture", now, 400)
        now += 450
        t.runtime("cudaGraphInstantiateWithFlags", now, 2500)
        now += 2600
        frame["dur"] = round(now - begin, 3)
        now += 200
    return t


def synth_in_flight() -> Trace:
    """The trace begins while the GPU still runs work launched before it: the host copies
    a result back (a blocking cudaMemcpy) and waits 400 ms for the stream, the GPU showing
    nothing of what it runs; then a steady GPU-bound loop."""
    t = Trace()
    t.op("aten::copy_", 0, 400_050)
    copy = t.runtime("cudaMemcpy", 10, 400_030)
    t.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": GPU,
                     "tid": 7, "ts": 400_020, "dur": 15,
                     "args": {"device": GPU, "stream": 7, "correlation": copy, "bytes": 256}})
    steady_gpu_loop(t, 400_100, 6)
    return t


def synth_no_steps_loader() -> Trace:
    """A training loop recorded without ProfilerStep ranges: each iteration reads a batch
    from a DataLoader in the main process (60 ms), runs forward and backward (GPU 30 ms,
    launched in 12 ms of host work), and an optimizer step."""
    t = Trace()
    now = 0.0
    for _ in range(8):
        t.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", now, 60_000)
        now += 60_010
        gpu = now
        for k in range(40):
            gpu = max(gpu, now + 8) + 700
            now = t.launch(now, f"cudnn_convolution_kernel_{k % 4}", gpu - 700, 700, call_us=290)
        opt = t.annotation("Optimizer.step#SGD.step", now, 0)
        begin = now
        for _k in range(10):
            gpu = max(gpu, now + 8) + 40
            now = t.launch(now, "multi_tensor_apply_kernel", gpu - 40, 40, call_us=20, op="aten::_foreach_add_")
        opt["dur"] = round(now - begin, 3)
        t.runtime("cudaStreamSynchronize", now, max(gpu - now, 1.0) + 2)
        now = max(gpu, now) + 10
    return t


def synth_queued_stream() -> Trace:
    """Two streams, eight ProfilerSteps: each step the host launches the main stream's
    kernels at once, to wait on an event from a side stream; then it works 15 ms on the CPU
    before it launches the side stream's kernel (5 ms) and records the event. The device
    holds the main stream's work, launched, for 20 ms and idles for 15 of them: the queued
    work waits on the side stream, which waits on the host."""
    t = Trace()
    now = 0.0
    for number in range(8):
        step_start = now
        t.runtime("cudaStreamWaitEvent", now + 2, 3)
        side_start = now + 15_030
        main_start = side_start + 5_000 + 3
        for k in range(5):
            now = t.launch(now + 6, f"gemv_kernel_{k}", main_start + k * 500, 450)
        t.op("aten::cpu_preprocess", now + 5, 15_000 - (now - step_start))
        now = step_start + 15_010
        side = t.runtime("cudaLaunchKernel", now, 6)
        t.kernel("embedding_bag_backward_kernel", side_start, 5_000, side, stream=13)
        t.runtime("cudaEventRecord", now + 8, 3)
        now += 20
        t.runtime("cudaStreamSynchronize", now, main_start + 5 * 500 - now + 5)
        now = main_start + 5 * 500 + 10
        t.annotation(f"ProfilerStep#{number}", step_start, now - step_start)
    return t


def synth_nested_preprocess() -> Trace:
    """An inference pipeline, one video per call: preprocess decodes the frames
    (read_video) and normalises them (normalize), in Python frames nested under the
    pipeline's __call__, with the GPU idle; then the model's forward launches its kernels."""
    t = Trace()
    now = 0.0
    for _ in range(6):
        call = t.python("transformers/pipelines/base.py(1300): __call__", now, 0)
        begin = now
        pre = t.python("video_pipeline.py(40): preprocess", now + 5, 0)
        decode = t.python("video_pipeline.py(52): read_video_pyav", now + 10, 0)
        t.python("av/container.py(80): decode", now + 12, 120_000)
        decode["dur"] = 120_010
        norm = t.python("transformers/image_transforms.py(300): normalize", now + 120_030, 0)
        t.op("aten::sub", now + 120_040, 15_000)
        t.op("aten::div", now + 135_050, 14_000)
        norm["dur"] = 29_100
        pre["dur"] = round(now + 149_200 - (now + 5), 3)
        now += 149_300
        forward = t.python("torch/nn/modules/module.py(1743): _call_impl", now, 0)
        module = t.python("nn.Module: VideoMAEForVideoClassification_0", now + 2, 0)
        gpu = now
        start = now
        for k in range(60):
            gpu = max(gpu, now + 8) + 900
            now = t.launch(now + 1, f"ampere_bf16_gemm_{k % 5}", gpu - 900, 900, call_us=30)
        module["dur"] = round(now - start - 1, 3)
        forward["dur"] = round(now - start + 1, 3)
        t.runtime("cudaStreamSynchronize", now + 2, max(gpu - now, 1.0))
        now = max(gpu, now) + 20
        call["dur"] = round(now - begin, 3)
        now += 50
    return t


def synth_range_mode() -> Trace:
    """A training loop recorded the way CUPTI's range mode (or a profiler given CPU
    activities only) records it: eight ProfilerSteps of operators and their launch calls,
    a loss read back with .item() each step, and no kernel, copy or set at all."""
    t = Trace()
    now = 0.0
    for step in range(8):
        begin = now
        t.annotation(f"ProfilerStep#{step}", begin, 0)
        for k in range(40):
            t.op("aten::mm" if k % 2 else "aten::add", now, 12)
            t.runtime("cudaLaunchKernel", now + 2, 6)
            now += 14
        t.op("aten::item", now, 900)
        t.op("aten::_local_scalar_dense", now + 1, 898)
        t.runtime("cudaMemcpyAsync", now + 3, 8)
        t.runtime("cudaStreamSynchronize", now + 12, 880)
        now += 905
        t.events[[e["name"] for e in t.events].index(f"ProfilerStep#{step}")]["dur"] = round(now - begin, 3)
    return t


def synth_warmup_second_call() -> Trace:
    """An inference loop over a TorchScript function: six steps, each one call of the
    scripted forward (40 kernels, GPU-bound, 4 ms). Its second call runs TorchScript's
    profiling executor's optimisation first: 296 ms of host work in the call before its
    kernels, once. Judged as a step, it reads as a host-bound loop."""
    t = Trace()
    now = 0.0
    for step in range(6):
        begin = now
        t.annotation(f"ProfilerStep#{step}", now, 0)
        call_start = now
        if step == 1:
            now += 296_000.0  # the optimisation: host work, nothing on the GPU
        gpu = now
        for k in range(40):
            gpu = max(gpu, now + 8) + 100
            now = t.launch(now, f"ampere_sgemm_64x32_nn_{k % 4}", gpu - 100, 100, op="aten::linear")
        t.op("forward", call_start, now - call_start + 2)
        sync = t.runtime("cudaDeviceSynchronize", now + 3, max(gpu - now, 1.0) + 3)
        del sync
        now = max(gpu, now) + 10
        t.events[[e["name"] for e in t.events].index(f"ProfilerStep#{step}")]["dur"] = round(now - begin, 3)
    return t


def synth_one_cold_pass() -> Trace:
    """A profile of one forward pass of a small CNN, cold: the first convolution's launch
    loads cuDNN's kernels and autotunes (1.34 s), then 30 convolution and elementwise
    kernels run once. No step, nothing repeats: a profile that cannot show a steady step."""
    t = Trace()
    first = t.runtime("cudaLaunchKernel", 100, 1_340_000)
    t.op("aten::cudnn_convolution", 50, 1_340_100)
    t.kernel("cudnn::conv2d_grouped_direct_kernel", 1_340_120, 900, first)
    now, gpu = 1_341_200.0, 1_341_200.0
    for k in range(30):
        gpu = max(gpu, now + 8) + 150
        now = t.launch(now, "cudnn::conv2d_grouped_direct_kernel" if k % 2 else "vectorized_elementwise_kernel",
                       gpu - 150, 150, op="aten::cudnn_convolution" if k % 2 else "aten::relu")
    t.runtime("cudaDeviceSynchronize", now + 3, max(gpu - now, 1.0) + 3)
    return t


def synth_module_steps_vs_syncs() -> Trace:
    """A serving worker's decode loop without ProfilerStep: ten engine steps, each a call of
    the model (nn.Module: Qwen2ForCausalLM, 40 kernels) and then of its LogitsProcessor a
    varying number of times (once per sequence group to sample), ending with a copy of the
    sampled tokens back to the host and a stream synchronize. The LogitsProcessor is the
    most frequent top-level module call, but it is not a step: the syncs are."""
    t = Trace()
    now = 0.0
    for step, processors in enumerate((1, 3, 2, 4, 1, 3, 2, 3, 1, 4)):
        begin = now
        gpu = now
        for k in range(40):
            gpu = max(gpu, now + 8) + 150
            now = t.launch(now, f"ampere_fp16_s16816gemm_fp16_128x64_{k % 4}", gpu - 150, 150, op="aten::linear")
        t.python("nn.Module: Qwen2ForCausalLM_0", begin, now - begin)
        for _ in range(processors):
            start = now
            gpu = max(gpu, now + 8) + 40
            now = t.launch(now, "softmax_warp_forward", gpu - 40, 40, op="aten::softmax")
            t.python("nn.Module: LogitsProcessor_0", start, now - start + 1)
            now += 2
        t.op("aten::_local_scalar_dense", now, 5)
        t.runtime("cudaMemcpyAsync", now + 1, 3)
        t.runtime("cudaStreamSynchronize", now + 5, max(gpu - now, 1.0) + 3)
        now = max(gpu, now + 8) + 400  # the scheduler's own work before the next step
    return t


def _rank_loop(t: Trace, rank: int, steps: int, *, extra_us: float) -> None:
    """One rank of a two-rank data-parallel loop: each step forward and backward kernels,
    then an all-reduce; ``extra_us`` of host work before the all-reduce (a rank that logs
    or validates every step) makes the other wait in its NCCL kernel."""
    now = 0.0
    for step in range(steps):
        begin = now
        t.annotation(f"ProfilerStep#{step}", now, 0)
        gpu = now
        for k in range(12):
            gpu = max(gpu, now + 8) + 300
            now = t.launch(now, f"ampere_sgemm_128x64_nn_{k % 3}", gpu - 300, 300)
        now += extra_us
        # The all-reduce ends on both ranks when the later one arrives (rank 1, about
        # 5.1 ms into the step) and has run: 6.6 ms in, on either rank.
        arrive = max(gpu, now + 8)
        done = begin + 6600.0
        t.op("nccl:all_reduce", now, 10)
        correlation = t.runtime("cudaLaunchKernel", now + 2, 5)
        t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", arrive,
                 done - arrive, correlation, stream=20)
        sync = t.runtime("cudaStreamSynchronize", now + 12, max(done - now - 12, 1.0) + 3)
        del sync
        now = done + 20
        t.events[[e["name"] for e in t.events].index(f"ProfilerStep#{step}")]["dur"] = round(now - begin, 3)


def synth_merged_ranks() -> Trace:
    """A two-rank data-parallel job whose traces were merged into one file the way
    TraceLens's TraceFusion merges them: every event carries args.rank, and its pid,
    correlation and External id are offset by the rank times a power of ten, the original
    kept as <field>_raw. Rank 1 does 5 ms of extra host work before each all-reduce, so
    rank 0 waits for it in every all-reduce: rank 1 is the straggler."""
    merged = Trace()
    for rank in (0, 1):
        t = Trace()
        _rank_loop(t, rank, 12, extra_us=5000.0 if rank == 1 else 0.0)
        for event in t.events:
            args = event.setdefault("args", {})
            args["rank"] = rank
            args["pid_raw"] = event["pid"]
            event["pid"] += rank * 10_000
            for field in ("correlation", "External id"):
                if isinstance(args.get(field), int) and args[field] >= 0:
                    args[f"{field}_raw"] = args[field]
                    args[field] += rank * 100_000
        merged.events.extend(t.events)
    return merged


AUTOGRAD_TID = 4299  # the thread autograd runs backward on, on a GPU


def synth_wrapped_training() -> Trace:
    """A small transformer's training loop wrapped whole in one torch.profiler.profile(), on
    a GPU: no ProfilerStep. Set-up first (the context made, 24 weights initialised and
    copied to the device: 600 ms); then twelve iterations, each a forward on the loop's
    thread (60 operators), backward on autograd's own thread (60 nodes, more operators
    than the loop's thread holds), an AdamW step run per parameter (48 parameters, five
    operators each: 4.8 ms of host work launching 4 us kernels) and the loss read back.
    The first iteration loads its kernels lazily (a 60 ms first launch)."""
    t = Trace()
    t.runtime("cudaFree", 0, 300_000)
    now = 300_100.0
    for k in range(24):
        t.op("aten::normal_", now, 8_000)
        now += 8_010
        t.op("aten::to", now, 300)
        copy = t.runtime("cudaMemcpyAsync", now + 5, 280)
        t.copy(now + 10, 260.0, copy, 4_194_304)
        now += 310
    gpu = now
    for iteration in range(12):
        t.annotation("Optimizer.zero_grad#AdamW.zero_grad", now, 20)
        now += 30
        for k in range(60):
            if iteration == 0 and k == 0:  # the first launch loads the module lazily
                t.op("aten::linear", now, 60_010)
                correlation = t.runtime("cudaLaunchKernel", now + 2, 60_000)
                gpu = max(gpu, now + 60_010) + 30
                t.kernel("ampere_sgemm_64x64_nn", gpu - 30, 30, correlation)
                now += 60_020
                continue
            gpu = max(gpu, now + 8) + 30
            now = t.launch(now, "ampere_sgemm_64x64_nn" if k % 2 else "vectorized_elementwise_kernel", gpu - 30,
                           30, call_us=30, op="aten::linear" if k % 2 else "aten::gelu")
        now = t.launch(now, "cross_entropy_forward", max(gpu, now + 8), 20, call_us=20, op="aten::cross_entropy_loss")
        gpu = max(gpu, now) + 20
        # backward, on autograd's thread: each node an outer range with two operators
        for k in range(60):
            node = t.op("autograd::engine::evaluate_function: AddmmBackward0", now, 0, tid=AUTOGRAD_TID)
            begin = now
            t.op("AddmmBackward0", now + 1, 0, tid=AUTOGRAD_TID)
            for _ in range(2):
                gpu = max(gpu, now + 8) + 30
                now = t.launch(now + 2, "ampere_sgemm_64x64_tn", gpu - 30, 30, call_us=20, op="aten::mm",
                               tid=AUTOGRAD_TID)
            node["dur"] = round(now - begin + 1, 3)
            now += 4
        step = t.annotation("Optimizer.step#AdamW.step", now, 0)
        begin = now
        for k in range(48 * 5):
            gpu = max(gpu, now + 8) + 4
            now = t.launch(now, "vectorized_elementwise_kernel", gpu - 4, 4, call_us=12,
                           op=("aten::mul_", "aten::add_", "aten::addcmul_", "aten::sqrt", "aten::addcdiv_")[k % 5])
            now += 2
        step["dur"] = round(now - begin, 3)
        t.op("aten::item", now, 0)
        item = t.events[-1]
        t.runtime("cudaMemcpyAsync", now + 2, 4)
        t.runtime("cudaStreamSynchronize", now + 8, max(gpu - now, 1.0) + 2)
        now = max(gpu, now + 10) + 5
        item["dur"] = round(now - item["ts"], 3)
        now += 200  # the loop's own Python: logging, the next batch's indices
    return t


def synth_compiled_iterations() -> Trace:
    """Three iterations of a torch.compile'd model's forward and backward, no ProfilerStep:
    each a compiled region on the loop's thread (six Triton kernels) and its backward on
    autograd's thread (six more). The first compiles (Dynamo and Inductor, 38 ms) and takes
    43.5 ms; the next two 5.2 and 4.9 ms, the GPU busy most of each."""
    t = Trace()
    now, gpu = 0.0, 0.0
    for iteration, extra in enumerate((0.0, 300.0, 0.0)):
        region = t.annotation("Torch-Compiled Region: 0/0", now, 0)
        begin = now
        if iteration == 0:
            t.annotation("compile_fx_inner (dynamo_timed)", now + 5, 38_000)
            now += 38_010
        compiled = t.op("CompiledFunction", now, 0)
        start = now
        for k in range(6):
            gpu = max(gpu, now + 8) + 340
            now = t.launch(now + 2, f"triton_poi_fused_add_mul_{k}", gpu - 340, 340, call_us=18, op="aten::empty")
        compiled["dur"] = round(now - start, 3)
        region["dur"] = round(now - begin + 2, 3)
        now += 30
        node = t.op("autograd::engine::evaluate_function: CompiledFunctionBackward", now, 0, tid=AUTOGRAD_TID)
        start = now
        for k in range(6):
            gpu = max(gpu, now + 8) + 420
            now = t.launch(now + 2, f"triton_red_fused_sum_{k}", gpu - 420, 420, call_us=18, op="aten::empty",
                           tid=AUTOGRAD_TID)
        node["dur"] = round(now - start, 3)
        t.runtime("cudaStreamSynchronize", now + 3, max(gpu - now, 1.0) + 3)
        now = max(gpu, now) + 20 + extra
    return t


def synth_gemm_benchmark() -> Trace:
    """A micro-benchmark of one fp16 GEMM, 4097 x 4097 x 4097 (one past a multiple of 8 in
    every dimension), no ProfilerStep: the context made (300 ms), the inputs drawn on the
    CPU and copied over (300 ms), two warm-up calls (the first creates cuBLAS's handle
    and workspace, 57 ms), then ten timed calls launched back to back, the host waiting
    for all of them in one synchronize. The GPU runs each GEMM in 900 us."""
    t = Trace()
    dims = {"Input Dims": [[4097, 4097], [4097, 4097]], "Input type": ["c10::Half", "c10::Half"]}
    t.runtime("cudaFree", 0, 300_000)
    now = 300_100.0
    for _ in range(2):
        t.op("aten::randn", now, 150_000)
        now += 150_010
        t.op("aten::to", now, 3_100)
        copy = t.runtime("cudaMemcpyAsync", now + 5, 3_050)
        t.copy(now + 20, 3_000.0, copy, 33_570_818)
        now += 3_110
    gpu = now
    for call in range(12):
        if call == 0:
            t.op("aten::mm", now, 57_030, **dims)
            t.runtime("cudaMalloc", now + 5, 57_000)
            now += 57_010
            correlation = t.runtime("cudaLaunchKernel", now, 12)
            gpu = max(gpu, now + 8) + 900
            t.kernel("ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_32x3_nn", gpu - 900, 900, correlation)
            now += 30
            continue
        gpu = max(gpu, now + 8) + 900
        now = t.launch(now, "ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_32x3_nn", gpu - 900, 900,
                       call_us=8, op="aten::mm", **dims)
        now += 6
    t.runtime("cudaDeviceSynchronize", now, max(gpu - now, 1.0) + 3)
    return t


def synth_serving_syncs() -> Trace:
    """A serving worker's decode loop, recorded without stacks or ProfilerStep: the weights
    copied in (200 ms), then twelve engine steps, each 48 small kernels (8 us each, 30 us
    of host work to launch) and the sampled tokens read back with .item(), one stream
    synchronize an engine step; between steps the scheduler's own Python (300 us). The
    GPU idles while the host launches: launch-bound."""
    t = Trace()
    now = 0.0
    for _ in range(8):
        t.op("aten::copy_", now, 25_000)
        copy = t.runtime("cudaMemcpyAsync", now + 5, 24_900)
        t.copy(now + 10, 24_800.0, copy, 268_435_456)
        now += 25_010
    gpu = now
    for _ in range(12):
        for k in range(48):
            gpu = max(gpu, now + 8) + 8
            now = t.launch(now, ("rms_norm_kernel", "ampere_fp16_gemv_kernel", "silu_and_mul_kernel")[k % 3],
                           gpu - 8, 8, call_us=26, op=("aten::rms_norm", "aten::linear", "aten::silu")[k % 3])
        gpu = max(gpu, now + 8) + 6
        now = t.launch(now, "argmax_kernel", gpu - 6, 6, call_us=20, op="aten::argmax")
        item = t.op("aten::item", now, 0)
        t.runtime("cudaMemcpyAsync", now + 2, 5)
        t.runtime("cudaStreamSynchronize", now + 9, max(gpu - now, 1.0) + 2)
        now = max(gpu, now + 10) + 4
        item["dur"] = round(now - item["ts"], 3)
        now += 300
    return t


def synth_one_pass_layers() -> Trace:
    """One forward pass of a 12-layer transformer, recorded without stacks or steps: the
    embedding, twelve identical layers (ten operators each), the final norm and the head
    (a 2.5 ms GEMM over the vocabulary), the host waiting at the end. The layers recur,
    but the pass does not: a profile of one pass, not twelve iterations."""
    t = Trace()
    now, gpu = 0.0, 0.0
    gpu = max(gpu, now + 8) + 40
    now = t.launch(now, "indexSelectLargeIndex", gpu - 40, 40, call_us=20, op="aten::embedding")
    layer = (("aten::layer_norm", "layer_norm_kernel", 20), ("aten::linear", "sm80_xmma_gemm_bf16_qkv", 90),
             ("aten::scaled_dot_product_attention", "flash_fwd_kernel", 120), ("aten::linear", "sm80_xmma_gemm_bf16",
             40), ("aten::add", "vectorized_elementwise_kernel", 15), ("aten::layer_norm", "layer_norm_kernel", 20),
             ("aten::linear", "sm80_xmma_gemm_bf16_fc1", 110), ("aten::gelu", "gelu_kernel", 25),
             ("aten::linear", "sm80_xmma_gemm_bf16_fc2", 110), ("aten::add", "vectorized_elementwise_kernel", 15))
    for _ in range(12):
        for op, kernel, took in layer:
            gpu = max(gpu, now + 8) + took
            now = t.launch(now, kernel, gpu - took, took, call_us=24, op=op)
    gpu = max(gpu, now + 8) + 20
    now = t.launch(now, "layer_norm_kernel", gpu - 20, 20, call_us=24, op="aten::layer_norm")
    gpu = max(gpu, now + 8) + 2_500
    now = t.launch(now, "sm80_xmma_gemm_bf16_vocab", gpu - 2_500, 2_500, call_us=24, op="aten::linear")
    t.runtime("cudaDeviceSynchronize", now + 3, max(gpu - now, 1.0) + 3)
    return t


def synth_sync_benchmark() -> Trace:
    """A micro-benchmark of one attention kernel, recorded with stacks: the script builds
    its inputs (400 ms of CPU work), then calls the op ten times, each call followed by
    torch.cuda.synchronize(), where the host waits for the 108 us kernel. The host sits
    in synchronize most of each iteration: a wait on the device, not host work."""
    t = Trace()
    module = t.python("bench.py(1): <module>", 0, 0)
    main = t.python("bench.py(50): main", 5, 0)
    make = t.python("bench.py(12): make_inputs", 10, 0)
    now = 15.0
    for _ in range(3):
        t.op("aten::randn", now, 133_000)
        now += 133_010
    make["dur"] = round(now - 10, 3)
    now += 20
    gpu = now
    for _ in range(10):
        run = t.python("bench.py(40): run_once", now, 0)
        begin = now
        t.op("aten::scaled_dot_product_attention", now + 2, 30,
             **{"Input Dims": [[8, 16, 1024, 64]] * 3, "Input type": ["c10::BFloat16"] * 3})
        gpu = max(gpu, now + 15) + 108
        t.launch(now + 4, "flash_fwd_kernel", gpu - 108, 108, call_us=14, op="aten::_flash_attention_forward")
        now += 34
        run["dur"] = round(now - begin, 3)
        sync = t.python("torch/cuda/__init__.py(1040): synchronize", now + 2, 0)
        inner = t.python("<built-in method _cuda_synchronize of PyCapsule object at 0x7f2c1a5b3c60>", now + 4, 0)
        waited = max(gpu - now - 6, 1.0) + 3
        t.runtime("cudaDeviceSynchronize", now + 6, waited)
        inner["dur"] = round(waited + 4, 3)
        sync["dur"] = round(waited + 8, 3)
        now += waited + 12
    main["dur"] = round(now - 5, 3)
    module["dur"] = round(now + 5, 3)
    return t


# -- AMD Instinct micro-benchmarks: one op called over and over, one kernel-level problem --------

TENSILE = ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT{tile}x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1"
           "_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA{vw}_GRVWB{vw}_ISA{isa}")


def rocm_bench(device: dict, op: str, args: dict, kernel: str, kernel_us: float, *, calls: int = 12,
               launch: str = "hipExtModuleLaunchKernel") -> Trace:
    """A ROCm micro-benchmark trace: inputs made on the CPU and copied over (200 ms), the op
    called ``calls`` times back to back (each one kernel of ``kernel_us``), the host
    waiting for all of them at the end. No ProfilerStep: each call is an iteration."""
    t = Trace(device)
    now = 0.0
    for _ in range(2):
        t.op("aten::randn", now, 90_000)
        now += 90_010
        t.op("aten::to", now, 9_000)
        copy = t.runtime("hipMemcpyWithStream", now + 5, 8_950)
        t.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Host -> Device)", "pid": GPU,
                         "tid": 0, "ts": round(now + 10, 3), "dur": 8_900.0,
                         "args": {"device": GPU, "stream": 0, "correlation": copy, "bytes": 134_217_728}})
        now += 9_010
    gpu = now
    for _ in range(calls):
        t.op(op, now, 30, **args)
        correlation = t.runtime(launch, now + 5, 20)
        gpu = max(gpu, now + 30) + kernel_us
        t.events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": GPU, "tid": 0,
                         "ts": round(gpu - kernel_us, 3), "dur": round(kernel_us, 3),
                         "args": {"device": GPU, "stream": 0, "correlation": correlation, "kind": "Dispatch Kernel",
                                  "grid": [256, 1, 1], "block": [256, 1, 1]}})
        now += 40
    t.runtime("hipDeviceSynchronize", now, max(gpu - now, 1.0) + 3)
    return t


def _bf16_gemm(m: int, n: int, k: int) -> dict:
    return {"Input Dims": [[m, k], [k, n]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}


def synth_rocm_misaligned_gemm() -> Trace:
    """MI300X: a bf16 GEMM one past a power of two in every dimension (4097^3), at 29% of
    the bf16 matrix peak (363 us a call for an ideal 105 us); hipBLASLt picks a kernel
    reading element by element (GRVWA1)."""
    return rocm_bench(MI300X, "aten::mm", _bf16_gemm(4097, 4097, 4097),
                      TENSILE.format(tile="256x256", vw=1, isa="942"), 363.0)


def synth_rocm_few_tiles() -> Trace:
    """MI300X: a bf16 GEMM of 256 x 1024 outputs over K = 16384: eight 256x128 tiles on 304
    compute units, at 2.4% of its roofline (333 us a call for an ideal 8 us)."""
    return rocm_bench(MI300X, "aten::mm", _bf16_gemm(256, 1024, 16384),
                      TENSILE.format(tile="256x128", vw=8, isa="942"), 333.0)


def synth_rocm_elementwise() -> Trace:
    """MI300X: an fp32 add of two 8192 x 8192 tensors at 36% of HBM bandwidth (422 us a call
    for the 805 MB it moves, 152 us at 5.3 TB/s)."""
    args = {"Input Dims": [[8192, 8192], [8192, 8192], []], "Input type": ["float", "float", "Scalar"]}
    kernel = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
              "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
    return rocm_bench(MI300X, "aten::add", args, kernel, 422.0, launch="hipLaunchKernel")


def synth_rocm_attention() -> Trace:
    """MI300X: scaled_dot_product_attention on bf16 [8, 16, 1024, 64] at 5% of its roofline
    (526 us a call for an ideal 26 us)."""
    args = {"Input Dims": [[8, 16, 1024, 64]] * 3 + [[], [], [], [], []],
            "Input type": ["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar", "", ""]}
    return rocm_bench(MI300X, "aten::scaled_dot_product_attention", args, "attn_fwd", 526.0,
                      launch="hipModuleLaunchKernel")


def synth_rocm_mi250x_misaligned_gemm() -> Trace:
    """MI250X (one GCD): the bf16 4097^3 GEMM at 29% of the GCD's 191.5 TFLOPS (2476 us a
    call for an ideal 718 us)."""
    return rocm_bench(MI250X, "aten::mm", _bf16_gemm(4097, 4097, 4097),
                      TENSILE.format(tile="256x256", vw=1, isa="90a"), 2476.0)


def synth_rocm_mi250x_few_tiles() -> Trace:
    """MI250X (one GCD): the 256 x 1024 x 16384 bf16 GEMM, eight 256x128 tiles on 110
    compute units, at 5% of its roofline (866 us a call for an ideal 45 us: 8.6 GFLOP at the
    GCD's 191.5 TFLOPS)."""
    return rocm_bench(MI250X, "aten::mm", _bf16_gemm(256, 1024, 16384),
                      TENSILE.format(tile="256x128", vw=8, isa="90a"), 866.0)


TRACES = {
    "synth_startup": synth_startup,
    "synth_capture": synth_capture,
    "synth_in_flight": synth_in_flight,
    "synth_no_steps_loader": synth_no_steps_loader,
    "synth_queued_stream": synth_queued_stream,
    "synth_nested_preprocess": synth_nested_preprocess,
    "synth_range_mode": synth_range_mode,
    "synth_merged_ranks": synth_merged_ranks,
    "synth_warmup_second_call": synth_warmup_second_call,
    "synth_one_cold_pass": synth_one_cold_pass,
    "synth_module_steps_vs_syncs": synth_module_steps_vs_syncs,
    "synth_wrapped_training": synth_wrapped_training,
    "synth_compiled_iterations": synth_compiled_iterations,
    "synth_gemm_benchmark": synth_gemm_benchmark,
    "synth_serving_syncs": synth_serving_syncs,
    "synth_one_pass_layers": synth_one_pass_layers,
    "synth_sync_benchmark": synth_sync_benchmark,
    "synth_rocm_misaligned_gemm": synth_rocm_misaligned_gemm,
    "synth_rocm_few_tiles": synth_rocm_few_tiles,
    "synth_rocm_elementwise": synth_rocm_elementwise,
    "synth_rocm_attention": synth_rocm_attention,
    "synth_rocm_mi250x_misaligned_gemm": synth_rocm_mi250x_misaligned_gemm,
    "synth_rocm_mi250x_few_tiles": synth_rocm_mi250x_few_tiles,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a committed trace differs")
    args = parser.parse_args(argv)
    differs = []
    for name, build in TRACES.items():
        path = CASES_DIR / name / "trace.json.gz"
        data = build().write(path)
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                differs.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"synth_traces: {path.relative_to(CASES_DIR.parent)} ({len(data):,} bytes)")
    if differs:
        print(f"synth_traces: differs from what this script writes: {', '.join(differs)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
