"""Matrix products: mm, addmm, bmm, baddbmm, addbmm, linear, matmul, mv, dot, _int_mm,
_scaled_mm. FLOPs are 2 * batch * m * n * k, a multiply-add counted as two as
torch.utils.flop_counter counts it; a bias or beta * self term is not counted (nor does
flop_counter count it), but its bytes are read."""

from __future__ import annotations

from advisor.knowledge.costs._model import (
    DTYPES,
    NAN,
    Arg,
    Args,
    OpCost,
    broadcast,
    compute_dtype,
    dtype_from_code,
    fmt_shape,
    prod,
    uncostable,
)


def _gemm(*, name: str, batch: int, m: int, n: int, k: int, reads: list[Arg], out_elements: int,
          out_itemsize: float, dtype: str, model: str) -> OpCost:
    return OpCost(
        flops=float(2 * batch * m * n * k),
        bytes_read=float(sum(a.nbytes for a in reads)),
        bytes_written=float(out_elements * out_itemsize),
        dtype=compute_dtype(dtype, "gemm"),
        kind="gemm",
        model=model,
        m=m, n=n, k=k, batch=batch,
    )


def _same_dtype(*tensors: Arg) -> str:
    shorts = {t.short for t in tensors}
    if len(shorts) != 1:
        raise uncostable(f"operands of different dtypes {sorted(shorts)}")
    return shorts.pop()


def _matrix(t: Arg, what: str) -> tuple[int, int]:
    if len(t.dims) != 2:
        raise uncostable(f"{what} is not a matrix: {fmt_shape(t.dims)}")
    return t.dims


def mm(name: str, args: Args) -> OpCost:
    """mm(self, mat2) and _int_mm; addmm(self, mat1, mat2, beta, alpha) and
    _addmm_activation(..., use_gelu)."""
    has_bias = name in ("aten::addmm", "aten::_addmm_activation")
    a = args.tensor(1 if has_bias else 0)
    b = args.tensor(2 if has_bias else 1)
    m, k = _matrix(a, "mat1")
    k2, n = _matrix(b, "mat2")
    if k != k2:
        raise uncostable("inner dimensions differ")
    reads = [a, b]
    bias_text = ""
    if has_bias:
        bias = args.opt_tensor(0)
        if bias is not None:
            reads.insert(0, bias)
            bias_text = f" + bias {fmt_shape(bias.dims)} (bytes only)"
    dtype = _same_dtype(a, b)
    out_itemsize = 4 if name == "aten::_int_mm" else DTYPES[a.type][1]
    if name == "aten::_int_mm":
        dtype = "int8"
    return _gemm(name=name, batch=1, m=m, n=n, k=k, reads=reads, out_elements=m * n, out_itemsize=out_itemsize,
                 dtype=dtype, model=f"2*m*n*k, m={m} n={n} k={k}{bias_text}")


def bmm(name: str, args: Args) -> OpCost:
    """bmm(self, mat2); baddbmm(self, batch1, batch2, beta, alpha); addbmm (sums the
    batch into one m x n result)."""
    offset = 0 if name == "aten::bmm" else 1
    a, b = args.tensor(offset), args.tensor(offset + 1)
    if len(a.dims) != 3 or len(b.dims) != 3:
        raise uncostable("bmm operands are not 3-D")
    batch, m, k = a.dims
    batch2, k2, n = b.dims
    if batch != batch2 or k != k2:
        raise uncostable("bmm operands do not match")
    reads = [a, b]
    if offset:
        self_ = args.opt_tensor(0)
        if self_ is not None:
            reads.insert(0, self_)
    out = m * n if name == "aten::addbmm" else batch * m * n
    return _gemm(name=name, batch=batch, m=m, n=n, k=k, reads=reads, out_elements=out,
                 out_itemsize=a.itemsize, dtype=_same_dtype(a, b),
                 model=f"2*batch*m*n*k, batch={batch} m={m} n={n} k={k}")


def linear(name: str, args: Args) -> OpCost:
    """linear(input, weight, bias): input [..., k] times weight [n, k] transposed."""
    x, w = args.tensor(0), args.tensor(1)
    if len(w.dims) != 2 or not x.dims:
        raise uncostable("linear weight is not a matrix")
    n, k = w.dims
    if x.dims[-1] != k:
        raise uncostable("linear input and weight do not match")
    m = prod(x.dims[:-1])
    reads = [x, w]
    bias = args.opt_tensor(2)
    if bias is not None:
        reads.append(bias)
    return _gemm(name=name, batch=1, m=m, n=n, k=k, reads=reads, out_elements=m * n, out_itemsize=x.itemsize,
                 dtype=_same_dtype(x, w),
                 model=f"2*m*n*k, m={m} (input {fmt_shape(x.dims)} folded) n={n} k={k}"
                       + (" + bias (bytes only)" if bias is not None else ""))


def matmul(name: str, args: Args) -> OpCost:
    """matmul(self, other) with torch.matmul's rules: a 1-D operand gains a dimension of
    one; an N-D first operand times a matrix folds into one mm; otherwise the batch
    dimensions broadcast into a bmm."""
    a, b = args.tensor(0), args.tensor(1)
    if not a.dims or not b.dims:
        raise uncostable("matmul of a zero-dim tensor")
    ad, bd = a.dims, b.dims
    if len(ad) == 1 and len(bd) == 1:
        if ad[0] != bd[0]:
            raise uncostable("dot operands differ in length")
        batch, m, n, k, out = 1, 1, 1, ad[0], 1
        how = "dot"
    elif len(bd) == 1:
        k = ad[-1]
        if bd[0] != k:
            raise uncostable("matrix-vector operands do not match")
        batch, m, n, out = 1, prod(ad[:-1]), 1, prod(ad[:-1])
        how = "matrix-vector, folded"
    elif len(ad) == 1:
        k, n = bd[-2], bd[-1]
        if ad[0] != k:
            raise uncostable("vector-matrix operands do not match")
        batch, m, out = prod(bd[:-2]), 1, prod(bd[:-2]) * n
        how = "vector-matrix"
    elif len(bd) == 2:
        k, n = bd
        if ad[-1] != k:
            raise uncostable("matmul operands do not match")
        batch, m, out = 1, prod(ad[:-1]), prod(ad[:-1]) * n
        how = "first operand folded into one mm" if len(ad) > 2 else "mm"
    else:
        m, k = ad[-2], ad[-1]
        k2, n = bd[-2], bd[-1]
        if k != k2:
            raise uncostable("matmul operands do not match")
        batch_dims = broadcast([ad[:-2], bd[:-2]])
        batch = prod(batch_dims)
        out = batch * m * n
        how = f"batch dims {fmt_shape(batch_dims)} broadcast"
    return _gemm(name=name, batch=batch, m=m, n=n, k=k, reads=[a, b], out_elements=out, out_itemsize=a.itemsize,
                 dtype=_same_dtype(a, b), model=f"2*batch*m*n*k ({how}), batch={batch} m={m} n={n} k={k}")


def mv(name: str, args: Args) -> OpCost:
    """mv(self, vec), addmv(self, mat, vec, beta, alpha), dot/vdot(self, other)."""
    if name in ("aten::dot", "aten::vdot"):
        a, b = args.tensor(0), args.tensor(1)
        if len(a.dims) != 1 or a.dims != b.dims:
            raise uncostable("dot operands differ")
        return _gemm(name=name, batch=1, m=1, n=1, k=a.dims[0], reads=[a, b], out_elements=1,
                     out_itemsize=a.itemsize, dtype=_same_dtype(a, b), model=f"2*k, k={a.dims[0]}")
    offset = 1 if name == "aten::addmv" else 0
    mat, vec = args.tensor(offset), args.tensor(offset + 1)
    m, k = _matrix(mat, "matrix")
    if vec.dims != (k,):
        raise uncostable("matrix-vector operands do not match")
    reads = [mat, vec]
    if offset and args.opt_tensor(0) is not None:
        reads.insert(0, args.tensor(0))
    return _gemm(name=name, batch=1, m=m, n=1, k=k, reads=reads, out_elements=m, out_itemsize=mat.itemsize,
                 dtype=_same_dtype(mat, vec), model=f"2*m*k, m={m} k={k}")


def scaled_mm(name: str, args: Args) -> OpCost:
    """_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype,
    use_fast_accum): an fp8 (or fp4) GEMM whose result dtype is ``out_dtype``, the
    operands' dtype where that is None."""
    a, b = args.tensor(0), args.tensor(1)
    m, k = _matrix(a, "self")
    k2, n = _matrix(b, "mat2")
    if a.type == "c10::Float4_e2m1fn_x2":
        raise uncostable("packed fp4 operands: the packing of k is not recorded")
    if k != k2:
        raise uncostable("inner dimensions differ")
    reads = [a, b] + [t for t in (args.opt_tensor(2), args.opt_tensor(3), args.opt_tensor(4), args.opt_tensor(5))
                      if t is not None]
    out_dtype = args.value(6)
    note = ""
    if out_dtype is None:
        out_itemsize = float(a.itemsize)
    elif dtype_from_code(out_dtype) is not None:
        out_itemsize = float(DTYPES[dtype_from_code(out_dtype)][1])
    else:
        out_itemsize = NAN
        note = "; out_dtype not recorded, so the bytes written are unknown"
    return _gemm(name=name, batch=1, m=m, n=n, k=k, reads=reads, out_elements=m * n, out_itemsize=out_itemsize,
                 dtype=a.short, model=f"2*m*n*k, m={m} n={n} k={k}{note}")


MODELS = {
    "aten::mm": mm,
    "aten::_int_mm": mm,
    "aten::addmm": mm,
    "aten::_addmm_activation": mm,
    "aten::bmm": bmm,
    "aten::baddbmm": bmm,
    "aten::addbmm": bmm,
    "aten::linear": linear,
    "aten::matmul": matmul,
    "aten::mv": mv,
    "aten::addmv": mv,
    "aten::dot": mv,
    "aten::vdot": mv,
    "aten::_scaled_mm": scaled_mm,
}
