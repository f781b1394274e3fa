"""Ops that move data without arithmetic: embedding lookups and their backward, row
gathers, copies and dtype conversions, concatenation, and the views and allocations that
move nothing at all.

An embedding reads only the rows it gathers (indices x embedding dim), not the table. A
copy reads the source's distinct elements and writes the destination's. A view or an
allocation costs nothing (kind "view" / "other", zero FLOPs and bytes) so a table can
show it as free rather than unknown. aten::to is not costed: it returns its input when
nothing changes and calls _to_copy (costed) when something does.
"""

from __future__ import annotations

from advisor.knowledge.costs._model import (
    DTYPES,
    MISSING,
    NAN,
    Args,
    OpCost,
    dtype_from_code,
    fmt_shape,
    prod,
    uncostable,
)


def embedding(name: str, args: Args) -> OpCost:
    """embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)."""
    weight, indices = args.tensor(0), args.tensor(1)
    if len(weight.dims) != 2:
        raise uncostable("embedding table is not 2-D")
    rows, dim = indices.numel, weight.dims[1]
    gathered = rows * dim * weight.itemsize
    return OpCost(flops=0.0, bytes_read=float(gathered + indices.nbytes), bytes_written=float(gathered),
                  dtype=weight.short, kind="embedding",
                  model=f"gathers {rows} rows of {dim} from a table {fmt_shape(weight.dims)}")


def embedding_dense_backward(name: str, args: Args) -> OpCost:
    """embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
    scale_grad_by_freq): adds each gradient row into a zeroed table of num_weights rows."""
    grad, indices = args.tensor(0), args.tensor(1)
    if not grad.dims:
        raise uncostable("grad_output is zero-dim")
    dim = grad.dims[-1]
    rows = indices.numel
    if rows * dim != grad.numel:
        raise uncostable("grad_output does not match the indices")
    num_weights = args.value(2)
    if type(num_weights) is int:
        written = float(num_weights * dim * grad.itemsize)
        table = f"a table of {num_weights} x {dim}"
    else:
        written = NAN
        table = "a table whose size is not recorded (bytes written unknown)"
    return OpCost(flops=float(rows * dim), bytes_read=float(grad.nbytes + indices.nbytes), bytes_written=written,
                  dtype=grad.short, kind="embedding", model=f"adds {rows} rows of {dim} into {table}")


def index_select(name: str, args: Args) -> OpCost:
    """index_select(self, dim, index): copies the selected slices."""
    x, index = args.tensor(0), args.tensor(2)
    dim = args.value(1)
    if type(dim) is not int:
        if len(x.dims) > 1:
            return OpCost(flops=0.0, bytes_read=NAN, bytes_written=NAN, dtype=x.short, kind="copy",
                          model="index_select: dim not recorded, so the slice size is unknown")
        dim = 0
    ndim = max(len(x.dims), 1)
    if not -ndim <= dim < ndim:
        raise uncostable("dim out of range")
    dim %= ndim
    slice_elements = prod(x.dims) // x.dims[dim] if x.dims and x.dims[dim] else 1
    moved = index.numel * slice_elements * x.itemsize
    return OpCost(flops=0.0, bytes_read=float(moved + index.nbytes), bytes_written=float(moved), dtype=x.short,
                  kind="copy", model=f"gathers {index.numel} slices of {slice_elements} along dim {dim}")


def copy_(name: str, args: Args) -> OpCost:
    """copy_(self, src, non_blocking): src (broadcast to self) into self."""
    dst, src = args.tensor(0), args.tensor(1)
    conversion = f" ({src.short} to {dst.short})" if src.short != dst.short else ""
    return OpCost(flops=0.0, bytes_read=float(src.nbytes), bytes_written=float(dst.distinct * dst.itemsize),
                  dtype=dst.short, kind="copy",
                  model=f"copies {src.distinct} elements into {fmt_shape(dst.dims)}{conversion}")


def to_copy(name: str, args: Args) -> OpCost:
    """_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format)."""
    x = args.tensor(0)
    code = args.value(1)
    if code is None:
        out_type = x.type
    else:
        out_type = dtype_from_code(code) if code is not MISSING else None
    if out_type is None:
        return OpCost(flops=0.0, bytes_read=float(x.nbytes), bytes_written=NAN, dtype="", kind="copy",
                      model="copy to a dtype that is not recorded: bytes written unknown")
    short, size = DTYPES[out_type]
    conversion = f" ({x.short} to {short})" if short != x.short else ""
    return OpCost(flops=0.0, bytes_read=float(x.nbytes), bytes_written=float(x.numel * size), dtype=short,
                  kind="copy", model=f"copies {x.numel} elements{conversion}")


def clone(name: str, args: Args) -> OpCost:
    x = args.tensor(0)
    return OpCost(flops=0.0, bytes_read=float(x.nbytes), bytes_written=float(x.numel * x.itemsize),
                  dtype=x.short, kind="copy", model=f"copies {x.numel} elements")


def _contiguous_strides(dims, order) -> tuple:
    """Dense strides of ``dims`` laying dimensions out in ``order`` (innermost last)."""
    strides = [0] * len(dims)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= dims[d]
    return tuple(strides)


def _is_dense(dims, strides, order) -> bool:
    expected = _contiguous_strides(dims, order)
    return all(size == 1 or s == e for size, s, e in zip(dims, strides, expected))


def contiguous(name: str, args: Args) -> OpCost:
    """contiguous(self, memory_format): itself when already laid out so, else a copy.
    Needs the strides and the memory format (0 contiguous, 2 channels last, 3 channels
    last 3d); without either it is left to the clone it calls, if it calls one."""
    x = args.tensor(0)
    fmt = args.value(1) if len(args) > 1 else 0
    if x.strides is None or type(fmt) is not int:
        raise uncostable("strides or memory format not recorded")
    ndim = len(x.dims)
    if fmt == 2 and ndim == 4:
        order = (0, 2, 3, 1)
    elif fmt == 3 and ndim == 5:
        order = (0, 2, 3, 4, 1)
    elif fmt == 0:
        order = tuple(range(ndim))
    else:
        raise uncostable(f"memory format {fmt}")
    if _is_dense(x.dims, x.strides, order):
        return OpCost(flops=0.0, bytes_read=0.0, bytes_written=0.0, dtype=x.short, kind="view",
                      model="already contiguous: returns itself")
    return OpCost(flops=0.0, bytes_read=float(x.nbytes), bytes_written=float(x.numel * x.itemsize),
                  dtype=x.short, kind="copy", model=f"copies {x.numel} elements into a contiguous layout")


def cat(name: str, args: Args) -> OpCost:
    """cat/_cat/stack(tensors, dim): the profiler records the list's sizes but not its
    dtype, so the element counts are known and the bytes are not."""
    tensors = args[0]
    if not tensors.is_tensor_list or not tensors.dims:
        raise uncostable("tensor list sizes not recorded")
    elements = sum(prod(d) for d in tensors.dims)
    return OpCost(flops=0.0, bytes_read=NAN, bytes_written=NAN, dtype="", kind="copy",
                  model=f"copies {elements} elements from {len(tensors.dims)} tensors; the list's dtype is not "
                        "recorded, so the bytes are unknown")


def view(name: str, args: Args) -> OpCost:
    first = args.tensors()[:1]
    return OpCost(flops=0.0, bytes_read=0.0, bytes_written=0.0, dtype=first[0].short if first else "",
                  kind="view", model="a view: no data moved")


def allocation(name: str, args: Args) -> OpCost:
    return OpCost(flops=0.0, bytes_read=0.0, bytes_written=0.0, dtype="", kind="other",
                  model="allocation: no data moved")


def dropout(name: str, args: Args) -> OpCost:
    """dropout(input, p, train) returns its input when not training; when training it
    calls ops that are costed (native_dropout, or bernoulli_ and mul on CPU)."""
    x = args.tensor(0)
    if args.value(2) is False:
        return OpCost(flops=0.0, bytes_read=0.0, bytes_written=0.0, dtype=x.short, kind="view",
                      model="dropout when not training returns its input")
    raise uncostable("training dropout is costed by the ops it calls")


VIEWS = (
    "alias", "view", "_unsafe_view", "view_as", "as_strided", "as_strided_", "expand", "expand_as", "transpose",
    "transpose_", "t", "t_", "permute", "squeeze", "squeeze_", "unsqueeze", "unsqueeze_", "select", "slice",
    "narrow", "detach", "detach_", "unfold", "diagonal", "unbind", "split", "split_with_sizes", "chunk",
    "_reshape_alias", "lift_fresh", "resolve_conj", "resolve_neg", "numpy_T", "movedim", "swapaxes", "real", "imag",
    "view_as_real", "view_as_complex",
)
ALLOCATIONS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")

MODELS = {
    "aten::embedding": embedding,
    "aten::embedding_dense_backward": embedding_dense_backward,
    "aten::index_select": index_select,
    "aten::copy_": copy_,
    "aten::_to_copy": to_copy,
    "aten::clone": clone,
    "aten::contiguous": contiguous,
    "aten::cat": cat,
    "aten::_cat": cat,
    "aten::stack": cat,
    "aten::dropout": dropout,
}
MODELS.update({f"aten::{name}": view for name in VIEWS})
MODELS.update({f"aten::{name}": allocation for name in ALLOCATIONS})
