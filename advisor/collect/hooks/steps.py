"""Steps and phases: where each step of the script begins and ends, and what it is doing.

Steps are marked as ``ProfilerStep#N`` ranges (the name torch itself gives them), and
phases as ``advisor::Dataloader``, ``advisor::Forward``, ``advisor::Backward`` and
``advisor::Optimization`` ranges inside the steps, without any change to the script.

Where a step starts (``step_source``), in order of preference:

``dataloader``
    Each time a DataLoader iterator's ``__next__`` is entered: a step is one batch, read
    and used, which is the Paddle profiler's batch_cost and makes the reader's share of the
    step directly visible. The step ends where the same iterator's next read starts, or
    where it runs out (the ``__next__`` that raises StopIteration is not a step). Reads
    from another loader while a step is open (an evaluation every N steps, a second loader
    zipped with the first) are Dataloader time inside that step, not steps; outside a
    step any loader's batches are steps, an evaluation loop after training included.
``optimizer``
    A script without a DataLoader that trains: a step ends once its optimizer step has
    run, at the next training event (forward, backward, zero_grad) or the end of the run.
    One optimizer step is one training step however many modules (model, loss) are called
    per iteration, and gradient accumulation counts its micro-batches as one step. The
    boundary is not put inside the optimizer's post-step hook itself because torch runs
    that hook inside its own ``Optimizer.step#...`` range, which the step would then cut.
``forward``
    A script without a DataLoader or an optimizer (inference): a step starts at each call
    of the first module that was called at top level (the model), so a loss or
    post-processing module called beside it does not split steps.
``manual``
    Steps are begun and ended by the caller (:meth:`Steps.begin_step`,
    :meth:`Steps.end_step`): advisor.Profiler's ``step()`` in the user's code. The hooks
    then mark phases only; a data-loader read is the Dataloader phase of whatever step is
    open.

The source is settled by what the script does first: the first top-level forward makes it
``forward`` until an optimizer step turns it into ``optimizer``; a DataLoader takes over
from either. Steps counted under a source that was later replaced are marked partial.
(``manual`` is chosen by the caller and never replaced.)

Phases never nest: a phase opens only when none is open, so forward and backward run
inside ``LBFGS.step(closure)`` count as Optimization and a recomputed forward inside
backward counts as Backward. The Forward phase is the outermost module call only.

A step is *partial* when its end is not a true step end: the run stopped (exception,
exit) while it was open, the loop that owned it was left by ``break``, or it was counted
under a step source that was later replaced. The trace's ``advisor`` metadata lists them
so readers can leave them out of per-step statistics.
"""

from __future__ import annotations

import collections
import functools
import importlib
import sys
import threading
import time
import weakref
from typing import Any

from advisor.collect.hooks import base
from advisor.collect.hooks.collection import (
    BACKWARD,
    DATALOADER,
    FORWARD,
    OPTIMIZATION,
    PHASE_LABELS,
    STEP_PREFIX,
    HostCollection,
)
from advisor.collect.hooks.loaders import Loaders, exhausted, first_batch_size
from advisor.collect.hooks.recorder import Recorder
from advisor.collect.steps import FORWARD_NO_GRAD, EnoughSteps, StepClock, StopAfter

# An inference loop whose model has been called this many times as a step has shown its
# model: from then on only the calls of the modules that opened a forward are hooked
# (Steps._hook_top_only), as long as there are no more than TOP_MODULES of them.
ROOT_ONLY_AFTER = 3
TOP_MODULES = 8
SITE_CALLS = 2000  # forward calls whose calling line is counted (a frame walk each)
MAX_FORWARD_SITES = 20  # lines kept, most calls first


class Range:
    """One open record_function range and the frame whose lifetime it belongs to."""

    __slots__ = ("name", "handle", "frame", "step", "token")

    def __init__(self, name: str, handle: Any, frame: Any, step: int = -1, token: Any = None):
        self.name = name
        self.handle = handle
        self.frame = frame
        self.step = step
        self.token = token  # the GPU collector's id for the range, where one listens


def _compiled_anything() -> bool:
    """Whether torch.compile has compiled a frame in this process (Dynamo loaded and its
    frame counter past zero): changing the module hooks then invalidates its guards."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return utils is not None and utils.counters["frames"]["total"] > 0
    except Exception:  # noqa: BLE001  (a private counter that may change: assume it compiled)
        return utils is not None


def _weak(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class Steps:
    """The step and phase marks of one run, and the step source that places them."""

    def __init__(self, torch: Any, result: HostCollection, recorder: Recorder, clock: StepClock,
                 loaders: Loaders, *, manual: bool, library_dirs: tuple[str, ...] = (),
                 stop: StopAfter | None = None):
        """``result``: the run's collection, whose step source, partial steps and batch
        size this concern keeps as it goes (the report reads them even if the run dies).
        ``stop``: when the script has run long enough after the window (None: to its end);
        the step that would open then raises EnoughSteps in the thread that made the hooks."""
        self._torch = torch
        self._stop = stop
        self._thread = threading.get_ident()
        self._result = result
        self._recorder = recorder
        self._listener = recorder.listener
        self._clock = clock
        self._loaders = loaders
        self._manual = manual
        # Where the model is called: counted for the first SITE_CALLS calls of a forward.
        self._library_dirs = tuple(library_dirs)
        self._forward_sites: collections.Counter[str] = collections.Counter()
        self._site_calls_left = SITE_CALLS if self._library_dirs else 0
        if manual:
            result.step_source = "manual"
        self._step: Range | None = None
        self._phase: Range | None = None
        self._next_step = 0
        self._step_done = False  # optimizer source: the open step has had its optimizer step
        self._step_owner: Any = None  # dataloader source: weakref to the iterator whose step is open
        self._forward_steps: list[int] = []  # steps counted while the source was "forward"
        self._step_work = False  # manual source: the open step has done more than a read that ran out
        self._root_module: Any = None
        self._root_optimizer: Any = None
        self._module_hooks: list[Any] = []
        self._top_modules: list[Any] = []  # weak references: modules that opened a forward
        self._root_only = False  # only those modules' calls are hooked (an inference loop)

    # -- the concern ---------------------------------------------------------------------

    def install(self, patches: base.Patches) -> None:
        torch = self._torch
        optim_mod = importlib.import_module("torch.optim.optimizer")
        dataloader_mod = importlib.import_module("torch.utils.data.dataloader")
        # Torch calls the global hooks around a compiled module's own call too: they must
        # not be compiled as frames of their own.
        base.hide_from_dynamo(_forward_pre_hook, _forward_hook, _optimizer_pre_hook, _optimizer_post_hook)
        self._hook_every_module()
        patches.on_undo(self._unhook_modules)
        patches.on_undo(optim_mod.register_optimizer_step_pre_hook(_optimizer_pre_hook).remove)
        patches.on_undo(optim_mod.register_optimizer_step_post_hook(_optimizer_post_hook).remove)
        patches.patch(dataloader_mod._BaseDataLoaderIter, "__next__", _wrap_next)
        backward = functools.partial(_wrap_phase, phase=BACKWARD)
        zero_grad = functools.partial(_wrap_phase, phase=OPTIMIZATION)
        patches.patch(torch.Tensor, "backward", backward)
        patches.patch(torch.autograd, "backward", backward)
        patches.patch(torch.optim.Optimizer, "zero_grad", zero_grad)
        patches.patch(torch.nn.Module, "zero_grad", zero_grad)
        # torch.compile(module) warns that global module hooks (ours) fire once more for the
        # OptimizedModule wrapper; only the outermost call counts here, and the warning is
        # about advisor, not the user's code.
        patches.ignore_warning(r"Using `torch\.compile\(module\)` when there are global hooks")

    def fill(self, result: HostCollection) -> None:
        result.steps = self._next_step
        result.forward_sites = dict(self._forward_sites.most_common(MAX_FORWARD_SITES))

    def _count_forward_site(self, frame: Any) -> None:
        """Count the user's line that called the model (the first frame outside installed
        code, walking out from torch's call of the module): the first SITE_CALLS forward
        calls only, so a loop of millions of calls pays for a few."""
        self._site_calls_left -= 1
        while frame is not None and str(frame.f_code.co_filename).startswith(self._library_dirs):
            frame = frame.f_back
        if frame is not None:
            self._forward_sites[f"{frame.f_code.co_filename}:{frame.f_lineno}"] += 1

    def close(self) -> None:
        """The run is over: close the open phase and step (the step partial)."""
        if self._phase is not None:
            self._close_phase()
        if self._step is not None:
            self._close_step(partial=True)

    def open_step(self) -> int | None:
        """The number of the step open now, or None."""
        step = self._step
        return step.step if step is not None else None

    def sample_state(self) -> tuple[int, str]:
        """Where the script is now, for the stack sampler: (open step or -1, phase or '')."""
        step, phase = self._step, self._phase
        return (step.step if step is not None else -1, PHASE_LABELS.get(phase.name, "") if phase is not None else "")

    # -- manual steps --------------------------------------------------------------------

    def begin_step(self, number: int) -> None:
        """``manual`` source: end the open step (complete) and begin step ``number``."""
        self._open_step(number)

    def end_step(self, *, partial: bool | None = None) -> None:
        """``manual`` source: end the open step. ``partial=None``: partial where nothing
        but a data-loader read that ran out happened in it (the step a loop's last
        ``step()`` opened), so it is left out of per-step figures like any cut-off step."""
        if self._step is not None:
            self._close_step(partial=not self._step_work if partial is None else partial)

    # -- module hooks --------------------------------------------------------------------

    def _hook_every_module(self) -> None:
        """Hook every module's call (torch's global module hooks): where a step begins and
        which module is the model is not known yet."""
        self._unhook_modules()
        module_mod = importlib.import_module("torch.nn.modules.module")
        self._module_hooks = [
            module_mod.register_module_forward_pre_hook(_forward_pre_hook),
            # always_call: the range is closed even when forward raises an Exception.
            module_mod.register_module_forward_hook(_forward_hook, always_call=True),
        ]

    def _hook_top_only(self) -> None:
        """An inference loop, each step a call of the model: hook only the modules whose
        calls opened a forward (the model, and a post-processing module beside it). Global
        module hooks send every module's call down torch's slow path (a small module's call
        takes twice as long), which on a step of a few dozen microseconds is most of what
        the step measures; the submodules need no hook once the top ones are known."""
        modules = [module for module in (ref() for ref in self._top_modules) if module is not None]
        self._unhook_modules()
        for module in modules:
            self._module_hooks += [module.register_forward_pre_hook(_forward_pre_hook),
                                   module.register_forward_hook(_forward_hook, always_call=True)]
        self._root_only = True

    def _hooks_for(self, recorded: bool) -> None:
        """A training loop's module hooks for the step opening: every module's call inside
        the recorded window (a module that opens a forward there for the first time is
        found), only the calls of the modules that opened one outside it, once they are
        known. Global hooks send every module's call down torch's slow path: kept for the
        whole run they made the steps timed as the job's own pace 15 % slower than the
        script's (a small model's loop)."""
        if self._result.step_source in (None, "forward"):
            return  # an inference loop: forward_pre decides (top-only after ROOT_ONLY_AFTER calls)
        if _compiled_anything():
            return  # Dynamo guards on the hooks: a change would recompile the job's model
        if recorded:
            if self._root_only:
                self._hook_every_module()
        elif (not self._root_only and self._next_step > ROOT_ONLY_AFTER + 1
              and 0 < len(self._top_modules) <= TOP_MODULES):
            self._hook_top_only()

    def _unhook_modules(self) -> None:
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks = []
        self._root_only = False

    # -- ranges --------------------------------------------------------------------------

    def _open_phase(self, name: str, frame: Any) -> None:
        if name != DATALOADER:
            self._step_work = True
        recorder = self._recorder
        self._phase = Range(name, recorder.enter(name), frame, token=recorder.opened(name))
        label = PHASE_LABELS[name]
        # A forward with autograd off is an evaluation: counted apart, it shapes the step.
        counted = FORWARD_NO_GRAD if label == "Forward" and not self._torch.is_grad_enabled() else None
        self._clock.phase_opened(label, counted_as=counted)

    def _close_phase(self) -> None:
        phase, self._phase = self._phase, None
        if phase is not None:
            self._clock.phase_closed()
            phase.handle.__exit__(None, None, None)
            self._recorder.closed(phase.token)

    def _phase_live(self) -> bool:
        """Whether a phase is open. A phase whose frame has gone without its closing hook
        running (KeyboardInterrupt in forward, an exception in optimizer.step that the
        script caught) is closed here, late but balanced."""
        if self._phase is None:
            return False
        if base.on_stack(self._phase.frame):
            return True
        self._close_phase()
        return False

    def _open_step(self, number: int | None = None) -> None:
        if self._step is not None:
            self._close_step(partial=False)
        number = self._next_step if number is None else number
        self._next_step = number + 1
        recorder = self._recorder
        recorded = recorder.before_step(number)
        stop = self._stop
        if (stop is not None and not recorded and recorder.past_window(number)
                and threading.get_ident() == self._thread and stop.enough(number)):
            raise EnoughSteps(number, stop.after(number))
        if self._listener is not None:
            self._listener.step_started(number)
        self._clock.step_opened(number, recorded=recorded)
        self._hooks_for(recorded)
        name = f"{STEP_PREFIX}{number}"
        self._step = Range(name, recorder.enter(name), None, number, token=recorder.opened(name))
        if self._result.step_source == "forward":
            self._forward_steps.append(number)
        self._step_done = False
        self._step_work = False

    def _close_step(self, *, partial: bool) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        if self._phase is not None:  # ranges stay nested: a phase never outlives its step
            self._close_phase()
        step.handle.__exit__(None, None, None)
        self._clock.step_closed(partial=partial)
        self._recorder.closed(step.token)
        if self._listener is not None:
            self._listener.step_ended(step.step, partial=partial)
        if partial:
            self._result.partial_steps.append(step.step)
        self._step_done = False
        self._step_owner = None

    def _replace_source(self, source: str, *, keep: Range | None = None) -> None:
        """Make ``source`` the step source. The open step (unless it is ``keep``) ends here;
        steps counted under a ``forward`` source (warm-up calls of the model before the
        real loop showed itself) become partial."""
        result = self._result
        old = result.step_source
        if self._step is not None and self._step is not keep:
            self._close_step(partial=not (old == "optimizer" and self._step_done))
        if old == "forward":
            for number in self._forward_steps:
                if (keep is None or number != keep.step) and number not in result.partial_steps:
                    result.partial_steps.append(number)
        result.step_source = source
        self._forward_steps = []
        self._top_modules = []
        if self._root_only:  # the loop trains after all: any module's call may open its forward
            self._hook_every_module()

    def _note_batch_size(self, batch: Any, source: str) -> None:
        try:
            size = first_batch_size(batch)
        except Exception:  # an exotic batch type must not break the user's run
            size = None
        if size is not None:
            self._result.batch_size = size
            self._result.batch_size_source = source

    # -- events --------------------------------------------------------------------------

    def dataloader_next(self, original: Any, iterator: Any, frame: Any) -> Any:
        loaders = self._loaders
        loader = loaders.entry(iterator)
        if self._phase_live():  # a batch fetched inside another phase is part of it
            return loaders.read(original, iterator, loader)
        if self._manual:  # the caller's steps: a read is the Dataloader phase of the open one
            batch = self._fetch(original, iterator, frame, loader)
            self._step_work = True
            if self._result.batch_size_source != "dataloader":
                self._note_batch_size(batch, "dataloader")
            return batch
        if self._result.step_source != "dataloader":
            self._replace_source("dataloader")
        if self._step is not None:
            owner = self._step_owner() if self._step_owner is not None else None
            if owner is not None and owner is not iterator:
                # Another loader read inside this step (an evaluation every N steps, a
                # second loader zipped with the first): its time belongs to this step.
                return self._fetch(original, iterator, frame, loader)
            # The loop that owned the step went away without running out (a break):
            # this step ran on into whatever followed the loop.
            self._close_step(partial=owner is None and self._step_owner is not None)
        opened_step = False
        if not exhausted(iterator):
            self._open_step()
            self._step_owner = weakref.ref(iterator)
            opened_step = True
        self._open_phase(DATALOADER, frame)
        try:
            batch = loaders.read(original, iterator, loader)
        except StopIteration:
            self._close_phase()
            if opened_step:  # the iterator's len() was not known: a step of nothing
                self._close_step(partial=True)
            raise
        finally:
            if self._phase is not None and self._phase.name == DATALOADER:
                self._close_phase()
        if self._result.batch_size_source != "dataloader":
            self._note_batch_size(batch, "dataloader")
        return batch

    def _fetch(self, original: Any, iterator: Any, frame: Any, loader: dict[str, Any]) -> Any:
        self._open_phase(DATALOADER, frame)
        try:
            return self._loaders.read(original, iterator, loader)
        finally:
            if self._phase is not None and self._phase.frame is frame:
                self._close_phase()

    def _training_event(self) -> None:
        """Forward, backward or zero_grad is starting: in the optimizer source this is where
        a step whose optimizer step has run ends and the next one starts."""
        if self._result.step_source == "optimizer" and (self._step_done or self._step is None):
            self._open_step()

    def forward_pre(self, module: Any, args: Any, frame: Any) -> None:
        if self._phase_live():
            return
        result = self._result
        source = result.step_source
        if source is None:
            self._replace_source("forward")
            self._root_module = _weak(module)
            self._open_step()
        elif source == "forward" and self._root_module() is module:
            self._open_step()
            if (not self._root_only and len(self._forward_steps) > ROOT_ONLY_AFTER
                    and len(self._top_modules) <= TOP_MODULES):
                self._hook_top_only()
        else:
            self._training_event()
        if result.batch_size is None and source in (None, "forward"):
            self._note_batch_size(args, "forward")
        if not self._root_only and len(self._top_modules) <= TOP_MODULES \
                and not any(ref() is module for ref in self._top_modules):
            # The modules that open a forward (the model, a loss module): an inference loop
            # hooks only them after a few calls, a training loop outside the recorded window.
            self._top_modules.append(_weak(module))
        if self._site_calls_left > 0:
            self._count_forward_site(frame)
        self._open_phase(FORWARD, frame)

    def forward_post(self, frame: Any) -> None:
        if self._phase is not None and self._phase.name == FORWARD and self._phase.frame is frame:
            self._close_phase()

    def wrapped_phase(self, name: str, call: Any, frame: Any) -> Any:
        if self._phase_live():
            return call()
        self._training_event()
        self._open_phase(name, frame)
        try:
            return call()
        finally:
            if self._phase is not None and self._phase.frame is frame:
                self._close_phase()

    def optimizer_pre(self, optimizer: Any, frame: Any) -> None:
        if self._phase_live():
            return
        self._training_event()
        self._open_phase(OPTIMIZATION, frame)

    def optimizer_post(self, optimizer: Any, frame: Any) -> None:
        if self._phase is not None and self._phase.name == OPTIMIZATION and self._phase.frame is frame:
            self._close_phase()
        source = self._result.step_source
        if source in (None, "forward"):
            # The first optimizer step: this script trains without a DataLoader. The step
            # that is open (started by this iteration's forward) is the first real one.
            current = self._step
            self._replace_source("optimizer", keep=current)
            self._root_optimizer = _weak(optimizer)
            self._step_done = current is not None
        elif source == "optimizer" and self._root_optimizer() is optimizer:
            self._step_done = self._step is not None


# The hook functions are module-level so that a hook left behind by a failed uninstall
# does nothing once its collector is gone.


def _forward_pre_hook(module: Any, args: Any) -> None:
    # The clock is read after acting(): torch.compile must not trace it (fullgraph fails on
    # a call it cannot trace), and acting() is all a traced hook may do.
    collector = base.acting()
    if collector is not None:
        began = time.perf_counter_ns()
        collector.steps.forward_pre(module, args, sys._getframe(1))
        # What the hooks cost is the collector's, not the job's (StepClock.own).
        collector.clock.own(time.perf_counter_ns() - began)


def _forward_hook(module: Any, args: Any, output: Any) -> None:
    collector = base.acting()
    if collector is not None:
        began = time.perf_counter_ns()
        collector.steps.forward_post(sys._getframe(1))
        collector.clock.own(time.perf_counter_ns() - began)


def _optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    collector = base.acting()
    if collector is not None:
        collector.steps.optimizer_pre(optimizer, sys._getframe(1))


def _optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    collector = base.acting()
    if collector is not None:
        collector.steps.optimizer_post(optimizer, sys._getframe(1))


def _wrap_next(original: Any) -> Any:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        collector = base.acting()
        if collector is None:
            return original(self)
        return collector.steps.dataloader_next(original, self, sys._getframe())

    return __next__


def _wrap_phase(original: Any, *, phase: str) -> Any:
    """A call that is a phase of the step (``backward``: Backward; ``zero_grad``:
    Optimization), marked as such where no phase is open."""

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        collector = base.acting()
        if collector is None:
            return original(*args, **kwargs)
        return collector.steps.wrapped_phase(phase, lambda: original(*args, **kwargs), sys._getframe())

    return wrapped
