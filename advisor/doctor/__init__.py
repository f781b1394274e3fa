"""`advisor doctor`: can this machine collect, and does the collector work on its GPU?

    machine      one check a line: the install, torch and its build, the host collector,
                 the NVIDIA driver, the GPUs, cupti-python against torch's CUDA, CUPTI
                 free of other clients, this machine's calibrated peaks
    gpu_checks   with --gpu-checks, on the user's GPU: kernels tied to ops and phases,
                 CUPTI's clock against the host's, kernel times against torch.profiler's,
                 every record field advisor reads, NVTX, dropped records, torch.compile
    children     the programs those checks run in fresh processes
    loop         the small training loop they collect (benchmarks time it too)

A front door like the command line: it drives the collectors and importers and reads
the sessions they make; nothing below it imports it.
"""

from advisor.doctor.gpu_checks import (
    CHECKS,
    Context,
    Result,
    render,
    run_checks,
    why_not_here,
    write_bundle,
)
from advisor.doctor.machine import (
    MachineCheck,
    Verdict,
    as_json,
    check_machine,
    render_machine,
    verdict,
)

__all__ = [
    "CHECKS",
    "Context",
    "MachineCheck",
    "Result",
    "Verdict",
    "as_json",
    "check_machine",
    "render",
    "render_machine",
    "run_checks",
    "verdict",
    "why_not_here",
    "write_bundle",
]
