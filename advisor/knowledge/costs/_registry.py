"""One op call's cost: the registry of models by op name and ``op_cost``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from advisor.knowledge.costs import (
    _attention,
    _conv,
    _elementwise,
    _gemm,
    _memory,
    _norm,
    _reduction,
)
from advisor.knowledge.costs._model import Args, OpCost, Uncostable

Model = Callable[[str, Args], OpCost]


def _merge(*tables: dict[str, Model]) -> dict[str, Model]:
    merged: dict[str, Model] = {}
    for table in tables:
        for name, model in table.items():
            if name in merged and merged[name] is not model:
                raise RuntimeError(f"two cost models for {name}")  # a bug in this package, found at import
            merged[name] = model
    return merged


MODELS = _merge(_gemm.MODELS, _conv.MODELS, _attention.MODELS, _elementwise.MODELS, _reduction.MODELS,
                _norm.MODELS, _memory.MODELS)


def costed_names() -> frozenset[str]:
    """Every op name (as traces spell it, "aten::mm") that has a cost model."""
    return frozenset(MODELS)


def cost_args(name: str, args: Args, *, conv_output_spatial: tuple | None = None) -> OpCost | None:
    """The cost of op ``name`` over parsed arguments; None where there is no model or the
    arguments do not fit it."""
    model = MODELS.get(name)
    if model is None:
        return None
    try:
        if conv_output_spatial is not None and name in _conv.FORWARD_NAMES:
            return _conv.conv_forward(name, args, output_spatial=conv_output_spatial)
        return model(name, args)
    except Uncostable:
        return None


def op_cost(name: str, input_dims: Any, input_types: Any, input_strides: Any = None,
            concrete_inputs: Any = None) -> OpCost | None:
    """FLOPs and bytes of one call of op ``name`` from what the profiler recorded.

    ``input_dims``, ``input_types``, ``input_strides`` and ``concrete_inputs`` are the
    profiler's "Input Dims", "Input type", "Input Strides" and "Concrete Inputs": lists,
    or their JSON text as the Session stores them. Returns None for an op without a
    model, or whose recorded arguments do not fit its model; never a guess.
    """
    if MODELS.get(name) is None:
        return None
    try:
        args = Args(input_dims, input_types, input_strides, concrete_inputs)
    except Uncostable:
        return None
    return cost_args(name, args)
