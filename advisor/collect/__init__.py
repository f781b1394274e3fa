"""Collectors: turn a running program into a Session.

    script          run the user's script as ``python train.py args`` would, under the
                    collectors, whatever way it ends (``run_script``)
    torch_hooks     the host collector: torch.profiler for the host side and the hooks
                    below, composed for one run (``HostCollector``)
    hooks/          one module per thing the hooks find without changing the script:
                    recorder (torch.profiler's window and parts), steps (steps and
                    phases), loaders, syncs (host-blocking source lines), uploads,
                    children (processes the script starts), compiles (torch.compile's
                    compilations)
    cupti           the built-in GPU collector (NVIDIA's cupti-python, ``advisor[cuda]``)
    cupti_records   CUPTI activity records to event rows, without importing CUPTI
    cupti_host      advisor's ranges recorded beside the CUPTI collector
    op_recorder     every op the script runs, while the CUPTI collector records: native
                    (torch's RecordFunction callbacks in C++) or, failing that, Python
    native/         the native op recorder's C++ source, built against the running torch
                    on first use and loaded with ctypes
    sampler         process and machine CPU use and RSS, sampled with psutil
    stacks          the main thread's and the DataLoader workers' Python stacks, sampled:
                    where host time goes in the user's own code
    spawned         the ranks a script starts with torch.multiprocessing.spawn, each run
                    under a collector of its own and saved as a rank of a job
    steps           the window of steps recorded (--steps), and the clock that times
                    every step, recorded or not
    cores           the cores the job may use (affinity, cgroup quota) and the time a
                    thread waited for one (a busy machine)
    ncu_run         the script run once more under Nsight Compute, limited to the kernels
                    that matter (``--kernel-counters``): the plan, its cost and its export
    handoff         what handing a batch over from a DataLoader worker costs on this
                    machine, timed after the run for a loader that made its batches in
                    the main process
    retime          the main thread's operator calls timed again at one thread after a
                    run recorded on a busy machine: the work the load's waits hid
    assemble        from a run to a Session: events, samples, devices, what was not
                    measured (``collect_script``)

A new collector is a module here that records while ``run_script`` runs the script and
hands its events to ``assemble``; it analyses nothing (tables and rules do).
"""

from __future__ import annotations

from advisor._lazy import lazy_exports

# Lazily: running a torchrun launch (advisor.job.launch imports spawned) must not load
# torch's hooks and pandas before its ranks start.
_EXPORTS = {"CollectedRun": "assemble", "collect_script": "assemble", "ScriptRun": "script", "run_script": "script"}

__all__ = ["CollectedRun", "ScriptRun", "collect_script", "run_script"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
