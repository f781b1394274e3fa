"""Op cost models: the FLOPs an op computes and the bytes it moves, from the shapes,
dtypes, strides (and, in newer traces, the concrete scalar arguments) the profiler
recorded for it.

The rules that reason about efficiency read these: below-roofline divides them by a
device's peaks for an ideal time, tensor-core-misalignment reads the GEMM and
convolution dims. FLOP counts follow torch.utils.flop_counter's conventions (a
multiply-add is 2 FLOPs; bias terms, softmax and causal masking are not counted) and are
tested against it; the elementwise, reduction and normalisation counts that
flop_counter does not have are documented with each model. Bytes are the ideal traffic:
each distinct input element read once, each output element written once.

Covered: GEMMs (mm, addmm, bmm, baddbmm, linear, matmul...), convolutions forward and
backward, scaled-dot-product attention and its flash / efficient / cuDNN kernels forward
and backward, elementwise ops and their backward, reductions and softmax, layer / batch /
group / RMS norm and their backward, embedding, copies, and (at zero cost) views and
allocations. Anything else, or a call whose recorded arguments do not fit its model, has
no cost (None / NaN): a cost is never guessed. Where part of a cost cannot be known from
the trace (a convolution's output size without its stride and padding), that part is NaN
and the model text says why.

    op_cost(name, input_dims, input_types, input_strides, concrete_inputs) -> OpCost | None
    cost_groups(op_rows) -> CostGroups     each distinct call costed once, and each row's group
    costs_for_ops(op_rows) -> DataFrame    one row per op row, each distinct call costed once
    kernel_costs(events) -> DataFrame      the cost of each GPU kernel tied to one op
"""

from advisor.knowledge.costs._model import DTYPES, KINDS, OpCost
from advisor.knowledge.costs._registry import costed_names, op_cost
from advisor.knowledge.costs._table import (
    COST_COLUMNS,
    KERNEL_COST_COLUMNS,
    CostGroups,
    cost_groups,
    costs_for_ops,
    kernel_costs,
)

__all__ = ["COST_COLUMNS", "DTYPES", "KERNEL_COST_COLUMNS", "KINDS", "CostGroups", "OpCost", "cost_groups",
           "costed_names", "costs_for_ops", "kernel_costs", "op_cost"]
