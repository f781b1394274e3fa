"""The fixes ``advisor verify`` can apply from outside a script, and how a rule names them.

A rule declares its fixes in its pack (``verify:``, rules/builtin/<id>.yaml; a user's pack may
name the same fixes with its own settings). Only the fixes below exist: a pack names one
and gives settings, data only, and nothing read from a pack runs as code. Settings may
take a figure of the finding (``"{fix_num_workers}"``; ``"{fix_torch_threads?}"`` is left out
where the finding has none).

Each fix is applied in the trial's own process before the script runs, by wrapping what
the script will call (DataLoader's and the optimizers' constructors, ``zero_grad``) or by
setting torch's switches; the script's file is never touched. Each counts the changes it
made (``apply_fixes`` returns the counts): a fix that found nothing to change in the script
(batched_index on a Dataset of its own) measures nothing, and verify says so rather than
comparing two runs of the same script.

    dataloader             num_workers, pin_memory, persistent_workers, prefetch_factor of every
                           DataLoader the script makes; torch_threads: torch.set_num_threads
    batched_index          a TensorDataset read without workers is indexed a batch at a time
    optimizer              foreach / fused for every optimizer that takes them
    zero_grad_set_to_none  zero_grad drops gradients instead of zeroing them
    tf32                   TF32 matrix work (set_float32_matmul_precision("high")): GPU only
    cudnn_benchmark        cuDNN picks its fastest convolution per shape: GPU only
    amp                    the script runs under autocast (bf16): opt-in, changes numerics
    fp32                   the script's CPU autocast is switched off: its matrix work runs in fp32
    compile                the model's forward is torch.compile'd after its first call: opt-in
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

__all__ = ["APPLIES_TO", "FIXES", "FixPlan", "apply_fixes", "plan_fix"]


@dataclass(frozen=True)
class FixKind:
    """What a fix is, for the plan: whether it needs a GPU, whether it must be asked for."""

    name: str
    gpu_only: bool = False
    opt_in: str = ""  # the --try name that allows it; empty: applied without asking
    numerics: bool = False  # it changes the numbers the script computes
    switches: tuple[str, ...] = ()  # settings that are on or off, whatever figure of the finding gives them


FIXES = {kind.name: kind for kind in (
    FixKind("dataloader"),
    FixKind("batched_index"),
    FixKind("optimizer", switches=("foreach", "fused")),
    FixKind("zero_grad_set_to_none"),
    FixKind("tf32", gpu_only=True, numerics=True),
    FixKind("cudnn_benchmark", gpu_only=True),
    FixKind("amp", opt_in="amp", numerics=True),
    FixKind("fp32", numerics=True),
    FixKind("compile", opt_in="compile"),
)}


@dataclass(frozen=True)
class FixPlan:
    """A fix resolved for one finding: its name and settings, in words too."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        words = {
            "dataloader": "DataLoader",
            "batched_index": "TensorDataset indexed a batch at a time",
            "optimizer": "optimizer",
            "zero_grad_set_to_none": "zero_grad(set_to_none=True)",
            "tf32": "TF32 matrix work (set_float32_matmul_precision('high'))",
            "cudnn_benchmark": "torch.backends.cudnn.benchmark = True",
            "amp": "autocast (bf16) around the whole script",
            "fp32": "CPU autocast off (matrix work in fp32)",
            "compile": "torch.compile of the model's forward",
        }[self.name]
        switches = FIXES[self.name].switches
        settings = ", ".join(f"{k}={bool(v) if k in switches else v}" for k, v in self.settings.items())
        numerics = " (changes numerics)" if FIXES[self.name].numerics else ""
        return f"{words} {settings}".strip() + numerics

    def trial_steps(self, warmup: int, steps: int) -> tuple[int, int]:
        """The warm-up and timed steps a trial of this fix needs, at least those asked: a
        DataLoader's N workers prefetch two batches each, so the steps that drain that queue
        are warm-up too, and a step's time is the mean over at least a round of them."""
        workers = int(self.settings.get("num_workers", 0) or 0) if self.name == "dataloader" else 0
        return (max(warmup, 2 * workers + 1), max(steps, 2 * workers)) if workers else (warmup, steps)

    def as_data(self) -> dict[str, Any]:
        return {"name": self.name, "settings": dict(self.settings)}


_REF = re.compile(r"^\{(\w+)(\?)?\}$")


def plan_fix(declared: list[Any], metrics: dict[str, Any]) -> FixPlan | None:
    """The first declared fix (a rule pack's ``verify`` entries) whose required metrics the
    finding has and whose settings resolve against them; None where none does."""
    for entry in declared:
        if any(not metrics.get(name) for name in entry.requires):
            continue
        settings: dict[str, Any] = {}
        resolved = True
        for key, value in entry.with_.items():
            match = _REF.match(value) if isinstance(value, str) else None
            if match is None:
                settings[key] = value
                continue
            figure = metrics.get(match.group(1))
            if figure is None:
                if match.group(2):  # optional: left out
                    continue
                resolved = False
                break
            settings[key] = figure
        if resolved:
            return FixPlan(entry.apply, settings)
    return None


# -- in the trial's process --------------------------------------------------------------------


# What each fix changes, for the line that says it changed nothing in a script.
APPLIES_TO = {
    "dataloader": "a DataLoader whose settings differ from the fix's",
    "batched_index": "a DataLoader over a TensorDataset, without workers or a collate_fn of its own",
    "optimizer": "an optimizer that takes foreach or fused",
    "zero_grad_set_to_none": "a zero_grad(set_to_none=False) call",
    "fp32": "a CPU autocast the script turns on",
    "compile": "a model's forward",
}


def apply_fixes(torch: Any, plans: list[dict[str, Any]]) -> dict[str, int]:
    """Put each fix in place (plans as ``FixPlan.as_data``), before the script runs; the
    changes each makes, by fix, counted as the script runs (a switch counts once)."""
    counts: dict[str, int] = {}
    for plan in plans:
        name = plan["name"]
        counts[name] = 0

        def changed(name: str = name) -> None:
            counts[name] += 1

        _APPLY[name](torch, dict(plan.get("settings") or {}), changed)
    return counts


# DataLoader's parameters in order: settings given by position become keywords before a fix
# changes them.
_LOADER_PARAMETERS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
                      "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator")


# Their defaults, for whether a fix's setting changes what the script asked.
_DEFAULTS = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}


def _keywords(args: tuple, kwargs: dict) -> dict:
    return {**dict(zip(_LOADER_PARAMETERS, args)), **kwargs}


def _wrap_init(cls: Any, change: Any) -> None:
    """``cls.__init__`` with its keyword arguments changed by ``change(self, args, kwargs)``."""
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        args, kwargs = change(self, args, kwargs)
        original(self, *args, **kwargs)

    cls.__init__ = __init__


def _dataloader(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    threads = settings.pop("torch_threads", None)
    if threads and int(threads) != torch.get_num_threads():
        torch.set_num_threads(int(threads))
        changed()
    loader_kwargs = {k: v for k, v in settings.items()
                     if k in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")}
    if "pin_memory" in loader_kwargs and not torch.cuda.is_available():
        loader_kwargs.pop("pin_memory")  # nothing to pin for without a GPU

    def change(self: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = _keywords(args, kwargs)
        if any(kwargs.get(key, _DEFAULTS.get(key)) != value for key, value in loader_kwargs.items()):
            changed()
        kwargs.update(loader_kwargs)
        if int(kwargs.get("num_workers", 0) or 0) == 0:
            kwargs.pop("persistent_workers", None)
            kwargs.pop("prefetch_factor", None)
        return (), kwargs

    _wrap_init(torch.utils.data.DataLoader, change)


def _batched_index(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    data = torch.utils.data

    class BatchedTensors(data.TensorDataset):
        """The same tensors, indexed a whole batch at once (the fetcher's __getitems__)."""

        def __getitems__(self, indices: list[int]) -> list[Any]:
            index = torch.as_tensor(indices)
            return [tensor[index] for tensor in self.tensors]

    def whole(batch: Any) -> Any:
        return batch

    def change(self: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = _keywords(args, kwargs)
        dataset = kwargs.get("dataset")
        if (type(dataset) is data.TensorDataset and kwargs.get("collate_fn") is None
                and not int(kwargs.get("num_workers", 0) or 0) and kwargs.get("batch_size", 1) is not None):
            kwargs["dataset"] = BatchedTensors(*dataset.tensors)
            kwargs["collate_fn"] = whole
            changed()
        return (), kwargs

    _wrap_init(data.DataLoader, change)


def _optimizer(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    wanted = {k: bool(v) for k, v in settings.items() if k in FIXES["optimizer"].switches}
    original = torch.optim.Optimizer.__init__

    def __init__(self: Any, params: Any, defaults: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        defaults = dict(defaults)
        for key, value in wanted.items():
            if key in defaults:  # only optimizers that take the setting
                if bool(defaults[key]) != value:
                    changed()
                defaults[key] = value
        original(self, params, defaults, *args, **kwargs)

    torch.optim.Optimizer.__init__ = __init__


def _zero_grad_set_to_none(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    for owner in (torch.optim.Optimizer, torch.nn.Module):
        original = owner.zero_grad

        def zero_grad(self: Any, set_to_none: bool = True, *, _original: Any = original) -> Any:
            if not set_to_none:  # the script's choice is what this fix replaces
                changed()
            return _original(self, set_to_none=True)

        owner.zero_grad = zero_grad


def _tf32(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    changed()
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def _cudnn_benchmark(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    changed()
    torch.backends.cudnn.benchmark = True


def _amp(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    changed()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Entered for the whole run and never left: the trial's process ends with the script.
    torch.autocast(device_type=device, dtype=torch.bfloat16).__enter__()


def _fp32(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    # Every torch.autocast("cpu", ...) the script opens is opened disabled: its matrix work
    # runs in the inputs' fp32. The trial's process ends with the script.
    base = torch.amp.autocast_mode.autocast
    original = base.__init__

    def __init__(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        if device_type == "cpu":
            if len(args) > 1:  # enabled given by position (dtype, enabled, ...)
                if args[1]:
                    changed()
                args = (args[0], False, *args[2:])
            else:
                if kwargs.get("enabled", True):
                    changed()
                kwargs["enabled"] = False
        original(self, device_type, *args, **kwargs)

    base.__init__ = __init__


def _compile(torch: Any, settings: dict[str, Any], changed: Callable[[], None]) -> None:
    state = {"depth": 0, "done": False}
    module_mod = torch.nn.modules.module
    handles: list[Any] = []

    def pre(module: Any, args: Any) -> None:
        state["depth"] += 1
        if state["depth"] == 1 and not state["done"]:
            state["done"] = True  # the first top-level module called is the model
            module.forward = torch.compile(module.forward)
            changed()

    def post(module: Any, args: Any, output: Any) -> None:
        state["depth"] -= 1
        if state["done"] and state["depth"] == 0:  # the model is known: no hook on later calls
            for handle in handles:
                handle.remove()
            handles.clear()

    handles += [module_mod.register_module_forward_pre_hook(pre),
                module_mod.register_module_forward_hook(post, always_call=True)]


_APPLY = {
    "dataloader": _dataloader,
    "batched_index": _batched_index,
    "optimizer": _optimizer,
    "zero_grad_set_to_none": _zero_grad_set_to_none,
    "tf32": _tf32,
    "cudnn_benchmark": _cudnn_benchmark,
    "amp": _amp,
    "fp32": _fp32,
    "compile": _compile,
}
