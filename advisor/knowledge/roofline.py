"""What the hardware can do, for the session at hand: the roofline's two ceilings.

The target is, in this order: the GPU named with ``--gpu`` (``SessionMeta.target_gpu``),
the session's own GPU matched in the knowledge base, or, for a CPU run, the host's peaks
measured by ``advisor calibrate`` and recorded in the session's CPU device. Ideal time is
max(flops / peak FLOP/s, bytes / peak bandwidth) for the unit the op can use: tensor cores
for GEMMs, convolutions and attention in fp16, bf16, fp8 or int8 (and TF32 where the
trace shows tensor-core kernels for fp32 work); CUDA cores otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from advisor.knowledge import hardware as kb
from advisor.session import Session

# Op kinds (advisor.knowledge.costs) that can run on tensor cores.
MATRIX_KINDS = ("gemm", "conv", "attention")


@dataclass(frozen=True)
class Target:
    """The device an op's ideal time is computed for."""

    kind: str  # "gpu" or "cpu"
    name: str
    how: str  # where its figures come from, for people
    profile: kb.GpuProfile | None = None
    cpu_flops: dict[str, float] = field(default_factory=dict)
    cpu_bandwidth: float | None = None
    measured_here: bool = True  # False: judged against a device the session did not run on

    @property
    def architecture(self) -> str | None:
        return self.profile.architecture if self.profile is not None else None

    def bandwidth(self) -> float | None:
        """Peak memory bandwidth, bytes/s."""
        if self.profile is not None:
            return kb.memory_bandwidth(self.profile)
        return self.cpu_bandwidth

    def peak(self, dtype: str | None, *, tensor_core: bool) -> float | None:
        """Peak FLOP/s for ``dtype`` on tensor cores or not; None where unknown."""
        if self.profile is not None:
            return kb.peak_flops(self.profile, dtype or "fp32", tensor_core)
        if not self.cpu_flops:
            return None
        # CPUs have no tensor cores; a dtype not measured falls back to the fp32 figure.
        return self.cpu_flops.get(dtype or "fp32") or self.cpu_flops.get("fp32")


def compute_dtype(cost_dtype: str | None) -> str | None:
    """advisor.knowledge.costs' dtype names to the knowledge base's ('tf32-eligible' is fp32 work
    that TF32 could take: it runs as fp32 unless the user allows TF32)."""
    if cost_dtype in (None, "", "tf32-eligible"):
        return "fp32" if cost_dtype == "tf32-eligible" else None
    return kb.normalize_dtype(cost_dtype) or cost_dtype


def compute_dtypes(cost_dtypes) -> np.ndarray:
    """``compute_dtype`` over an array of them (object array out), worked out once per
    distinct value: cost tables have a row per op call, and a few dtypes."""
    codes, distinct = pd.factorize(np.asarray(cost_dtypes, dtype=object), sort=False)  # missing: code -1
    looked_up = np.array([compute_dtype(d) for d in distinct] + [compute_dtype(None)], dtype=object)
    return looked_up[np.where(codes >= 0, codes, len(distinct))]


def resolve_target(session: Session) -> tuple[Target | None, str]:
    """The target device and how it was chosen, or None and why there is none."""
    meta = session.meta
    if meta.target_gpu:
        profile = kb.gpu_profile(meta.target_gpu)
        own = next((d for d in session.gpu_devices()), None)
        here = own is not None and kb.match_device(own) is not None and kb.match_device(own).id == profile.id
        return Target("gpu", profile.names[0], f"{profile.id} from the knowledge base (--gpu)", profile,
                      measured_here=here), ""
    gpus = session.gpu_devices() if meta.collector.gpu_measured else []
    if gpus:
        match = kb.device_match(gpus[0])
        if match.profile is None:
            return None, f"{gpus[0].name}: {match.why}; pass --gpu NAME to judge against a known device"
        return Target("gpu", match.profile.names[0], f"{match.profile.id} from the knowledge base ({match.how})",
                      match.profile), ""
    cpu = next((d for d in meta.devices if d.kind == "cpu"), None)
    if cpu is not None and cpu.peak_flops:
        bandwidth = cpu.memory_bandwidth_gbps * 1e9 if cpu.memory_bandwidth_gbps else None
        return Target("cpu", cpu.name, "this machine's peaks from advisor calibrate", None,
                      dict(cpu.peak_flops), bandwidth), ""
    return None, ("no peak FLOP/s or bandwidth known for this session's device: run `advisor calibrate` "
                  "on this machine, or pass --gpu NAME")
