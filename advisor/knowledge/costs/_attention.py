"""Scaled dot-product attention and the kernels it dispatches to, forward and backward.

FLOPs follow torch.utils.flop_counter: the forward is two batched GEMMs, Q K^T and
P V, 2*B*H*S_q*S_k*(D_qk + D_v); the backward is five (the scores recomputed, then grad P,
grad V, grad Q, grad K), 2*B*H*S_q*S_k*(3*D_qk + 2*D_v). Softmax,
scaling and masking are not counted, and neither is causal masking: a causal kernel
skips about half of this work, and the model says so where the trace records is_causal.
With grouped-query attention (fewer key/value heads) the work is per query head.

The _flash_attention_* and _efficient_attention_* kernels take (batch, seq, heads, dim)
tensors where the sdpa ops take (batch, heads, seq, dim); their dims are read in their own
layout. (flop_counter reads those two kernels as if they were (batch, heads, seq, dim),
which is wrong for dense inputs; it only reaches them for nested tensors.) Variable-length
(3-D, packed) inputs record no per-sequence lengths, so their FLOPs are unknown.
"""

from __future__ import annotations

from advisor.knowledge.costs._model import (
    NAN,
    Arg,
    Args,
    OpCost,
    compute_dtype,
    fmt_shape,
    prod,
    uncostable,
)

# name -> (positions of q, k, v, grad_out or None, whether dims are (B, S, H, D), is_causal position)
_FORWARD = {
    "aten::scaled_dot_product_attention": (0, 1, 2, None, False, 5),
    "aten::_scaled_dot_product_attention_math": (0, 1, 2, None, False, 5),
    "aten::_scaled_dot_product_flash_attention": (0, 1, 2, None, False, 4),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, 1, 2, None, False, 4),
    "aten::_scaled_dot_product_efficient_attention": (0, 1, 2, None, False, 6),
    "aten::_scaled_dot_product_cudnn_attention": (0, 1, 2, None, False, 6),
    "aten::_flash_attention_forward": (0, 1, 2, None, True, 8),
    "aten::_efficient_attention_forward": (0, 1, 2, None, True, None),
}
_BACKWARD = {
    "aten::_scaled_dot_product_flash_attention_backward": (1, 2, 3, 0, False, 11),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, 2, 3, 0, False, 7),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 2, 3, 0, False, 11),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 2, 3, 0, False, 14),
    "aten::_flash_attention_backward": (1, 2, 3, 0, True, 11),
    "aten::_efficient_attention_backward": (1, 2, 3, 0, True, None),
}
# Extra tensors each op reads (a mask or bias) or that backward reads (out, logsumexp).
_EXTRA_READS = {
    "aten::scaled_dot_product_attention": (3,),
    "aten::_scaled_dot_product_attention_math": (3,),
    "aten::_scaled_dot_product_efficient_attention": (3,),
    "aten::_scaled_dot_product_cudnn_attention": (3,),
    "aten::_efficient_attention_forward": (3,),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (5,),
    "aten::_scaled_dot_product_flash_attention_backward": (4, 5),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (4, 5, 8),
    "aten::_scaled_dot_product_efficient_attention_backward": (4, 5, 6),
    "aten::_scaled_dot_product_cudnn_attention_backward": (4, 5, 8),
    "aten::_flash_attention_backward": (4, 5),
    "aten::_efficient_attention_backward": (4, 5, 10),
}
# Forward kernels that also write the log-sum-exp of each query row (fp32, B*H*S_q).
_WRITES_LSE = {
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_flash_attention_forward",
}


def _bhsd(t: Arg, seq_first: bool) -> tuple[int, int, int, int]:
    """(batch, heads, seq, dim) of a 4-D attention operand; a 3-D one (sdpa without a head
    dimension) has one head; other ranks fold their leading dims into the batch."""
    dims = t.dims
    if seq_first:
        if len(dims) != 4:
            raise uncostable(f"packed (variable-length) attention input {fmt_shape(dims)}")
        b, s, h, d = dims
        return b, h, s, d
    if len(dims) < 3:
        raise uncostable(f"attention operand {fmt_shape(dims)} has no batch")
    if len(dims) == 3:
        return dims[0], 1, dims[1], dims[2]
    return prod(dims[:-3]), dims[-3], dims[-2], dims[-1]


def attention(name: str, args: Args) -> OpCost:
    backward = name in _BACKWARD
    qi, ki, vi, gi, seq_first, causal_at = (_BACKWARD if backward else _FORWARD)[name]
    q, k, v = args.tensor(qi), args.tensor(ki), args.tensor(vi)
    if seq_first and len(q.dims) == 3:
        return _packed(args, q, k, v, backward, gi)
    b, hq, sq, dq = _bhsd(q, seq_first)
    bk, hk, sk, dk = _bhsd(k, seq_first)
    bv, hv, sv, dv = _bhsd(v, seq_first)
    if not (b == bk == bv and hk == hv and dq == dk and sk == sv):
        raise uncostable("query, key and value do not fit together")
    if hq < hk or hq % hk:
        raise uncostable("query heads are not a multiple of key/value heads")
    batch = b * hq
    gemm = 2 * batch * sq * sk
    if backward:
        grad = args.tensor(gi)
        flops = gemm * dq + gemm * dv + gemm * dv + gemm * dq + gemm * dq
        formula = "2*B*H*S_q*S_k*(3*D_qk + 2*D_v): scores recomputed, grad P, grad V, grad Q, grad K"
        reads = [grad, q, k, v] + [a for a in (args.opt_tensor(i) for i in _EXTRA_READS.get(name, ())) if a]
        written = q.numel * q.itemsize + k.numel * k.itemsize + v.numel * v.itemsize
    else:
        flops = gemm * dq + gemm * dv
        formula = "2*B*H*S_q*S_k*(D_qk + D_v): Q K^T and P V"
        reads = [q, k, v] + [a for a in (args.opt_tensor(i) for i in _EXTRA_READS.get(name, ())) if a]
        written = batch * sq * dv * q.itemsize
        if name in _WRITES_LSE:
            written += batch * sq * 4
    model = f"attention {'backward ' if backward else ''}{formula}, B={b} H={hq} S_q={sq} S_k={sk} D_qk={dq} D_v={dv}"
    if hk != hq:
        model += f" (grouped-query: {hk} key/value heads)"
    if causal_at is not None and args.value(causal_at) is True:
        model += "; causal: the kernel computes about half of this"
    model += "; softmax not counted"
    return OpCost(flops=float(flops), bytes_read=float(sum(a.nbytes for a in reads)), bytes_written=float(written),
                  dtype=compute_dtype(q.short, "attention"), kind="attention", model=model,
                  m=sq, n=sk, k=dq, batch=batch)


def _packed(args: Args, q: Arg, k: Arg, v: Arg, backward: bool, gi: int) -> OpCost:
    """Variable-length attention over packed (total tokens, heads, dim) tensors: the bytes
    are known, the FLOPs need each sequence's length, which the trace does not hold."""
    reads = [q, k, v] + ([args.tensor(gi)] if backward else [])
    written = (q.numel * q.itemsize + k.numel * k.itemsize + v.numel * v.itemsize) if backward \
        else q.dims[0] * q.dims[1] * v.dims[-1] * q.itemsize
    return OpCost(flops=NAN, bytes_read=float(sum(a.nbytes for a in reads)), bytes_written=float(written),
                  dtype=compute_dtype(q.short, "attention"), kind="attention",
                  model="variable-length attention: the sequence lengths are not recorded, so the FLOPs are unknown",
                  k=q.dims[-1])


MODELS = {name: attention for name in (*_FORWARD, *_BACKWARD)}
