"""The step model: what a step is and where its time goes, built once per Session.

Between the Session and the tables. It chooses the steady window (steps recorded, else
inferred, else the stretch where the work runs; start-up, compilation, capture, work in
flight and start-up steps set apart), makes the steady Session every later stage judges,
partitions the window's time by cause, and holds the dependency graph of the steady steps
on which fixes are replayed:

    model       StepModel and build_step_model: the one object the later stages read
    window      the steady window: steps, their source, what is set apart and why
    iterations  steps found from what repeats where the profile marks none: the signal
                (loader reads, optimizer steps, model calls, a user range, graph replays,
                syncs, the same calls or kernels recurring) and its iterations
    steady      the steady Session: inferred steps made steps, set-apart steps not steps
    facts       what several tables and the step model need from one session, worked out once
    timing      how long a step takes: the mean step (the job's, the recorded steps', the
                unrecorded steps'), worked out here and read everywhere else
    waits       the host's waits on the device (blocking calls), with the user's line
    idle        the window's time by cause, each nanosecond once; host time by frame
    graph       the dependency graph of the steady steps: host order, launches, streams,
                cross-stream waits, host waits on the device; its critical path
    pace        the job's own pace: what the profiler cost each host node, taken off every
                replay (from the steps run unprofiled, or a calibrated per-op cost)
    load        a run recorded on a busy machine weighed as on a quiet one: Python by the
                share its thread ran, operator calls by their time at one thread
    whatif      fixes as changes to that graph, replayed: a saving is the replayed
                step's reduction
"""

from advisor.step.model import StepModel, build_step_model
from advisor.step.timing import StepTimes
from advisor.step.window import Periodic, SetApart, SteadyWindow

__all__ = ["Periodic", "SetApart", "SteadyWindow", "StepModel", "StepTimes", "build_step_model"]
