"""The gpu_origin table: GPU time by what started it (eager launches, CUDA graph replays,
Triton kernels, copies and sets, nothing recorded), on a hand-made session."""

from __future__ import annotations

import pytest
from conftest import shared_trace
from builders import Trace

from advisor.importers import load
from advisor.tables import compute_tables

MS = 1_000_000


def test_graph_replays_and_compiled_kernels_are_counted_apart_from_eager_work():
    t = Trace()
    t.step(1, 0, 20)
    graph = t.call("cudaGraphLaunch", 1, 1.1)
    t.gpu("triton_poi_fused_add_mul_0", "kernel", 2, 4, launch=graph)  # compiled code in a graph
    t.gpu("ampere_sgemm_128x64_nn", "kernel", 4, 7, launch=graph)
    t.gpu("triton_red_fused_sum_1", "kernel", 8, 9, launch=t.call("cudaLaunchKernel", 7.5, 7.6))
    t.gpu("void at::native::vectorized_elementwise_kernel", "kernel", 10, 10.5,
          launch=t.call("cudaLaunchKernel", 9.5, 9.6))
    t.gpu("Memcpy HtoD (Pinned -> Device)", "memcpy", 11, 11.2, launch=t.call("cudaMemcpyAsync", 10.8, 10.9),
          copy_kind="HtoD")
    t.gpu("void at::native::reduce_kernel", "kernel", 12, 14)  # its launch is not in the profile
    table = compute_tables(t.session(), ["gpu_origin"])["gpu_origin"]
    assert table.at["CUDA graph replays", "gpu_ns"] == 5 * MS and table.at["CUDA graph replays", "kernels"] == 2
    assert table.at["CUDA graph replays", "triton_ns"] == 2 * MS
    assert table.at["compiled (Triton) kernels", "gpu_ns"] == 1 * MS
    assert table.at["eager kernels", "gpu_ns"] == 0.5 * MS
    assert table.at["copies and sets", "gpu_ns"] == 0.2 * MS
    assert table.at["unattributed", "gpu_ns"] == 2 * MS
    assert table["share_of_gpu"].sum() == pytest.approx(1.0)


def test_an_eager_training_trace_is_all_eager_launches():
    table = compute_tables(load(shared_trace("resnet50_v100_num_workers_4.pt.trace.json.gz")),
                           ["gpu_origin"])["gpu_origin"]
    assert table.at["eager kernels", "share_of_gpu"] > 0.95
    assert table.at["CUDA graph replays", "gpu_ns"] == 0 and table.at["unattributed", "gpu_ns"] == 0
