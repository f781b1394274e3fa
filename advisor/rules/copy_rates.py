"""The rate a copy between the host and a GPU reaches from pinned memory: what pinning gives.

A copy from pageable memory is staged by the driver through a pinned buffer, at a fraction
of the link's rate, and the host waits for it. Pinning the memory (DataLoader(pin_memory=
True), ``tensor.pin_memory()`` once) lets the copy run at the link's rate, asynchronously.
A fix that pins must therefore change the copy's own time too, not only drop the host's
wait, and never at the pageable copy's own rate. Where the rate comes from, best first:

1. the session itself: pinned copies of at least ``MIN_BYTES`` in the same direction, their
   bytes over their time;
2. ``advisor calibrate`` on this machine's GPU (``host_copy_gbps``), where its device is the
   session's;
3. the knowledge base: the GPU's PCIe link as its datasheet prints it, times
   ``LINK_EFFICIENCY``: an estimate, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from advisor.rules.registry import RuleContext

__all__ = ["LINK_EFFICIENCY", "MIN_BYTES", "CopyRate", "pinned_rate"]

MIN_BYTES = 1 << 20  # smaller copies are latency, not rate
# A large pinned copy reaches about this share of the link's datasheet rate per direction
# (an H200 recording: 7 MB copies at 54 GB/s over PCIe Gen5 x16's 63).
LINK_EFFICIENCY = 0.85


@dataclass(frozen=True)
class CopyRate:
    gbps: float  # GB/s, bytes per ns
    source: str  # where it comes from, in words
    estimate: bool  # not measured on this machine


def pinned_rate(ctx: RuleContext, direction: str) -> CopyRate | None:
    """The rate a copy in ``direction`` ('HtoD' or 'DtoH') reaches from pinned memory on the
    session's GPU, or None where nothing says."""
    measured = _from_session(ctx, direction)
    if measured is not None:
        return measured
    devices = ctx.model.session.meta.devices if ctx.model is not None else []
    device = next((d for d in devices if d.kind == "gpu"), None)
    calibrated = _from_calibration(device, direction)
    if calibrated is not None:
        return calibrated
    return _from_knowledge(device, direction)


def _from_session(ctx: RuleContext, direction: str) -> CopyRate | None:
    if ctx.model is None:
        return None
    gpu = ctx.model.facts.gpu
    if not len(gpu) or "copy_kind" not in gpu.columns:
        return None
    side = "src_memory" if direction == "HtoD" else "dst_memory"
    mine = ((gpu["kind"] == "memcpy").to_numpy() & (gpu["copy_kind"].astype(str) == direction).to_numpy()
            & (gpu[side].astype(str) == "Pinned").to_numpy() & (gpu["bytes"].to_numpy() >= MIN_BYTES))
    if not mine.any():
        return None
    took = (gpu["end_ns"] - gpu["start_ns"]).to_numpy()[mine].astype(np.float64)
    moved = gpu["bytes"].to_numpy()[mine].astype(np.float64)
    if took.sum() <= 0:
        return None
    gbps = float(moved.sum() / took.sum())
    return CopyRate(gbps, f"this session's own pinned {direction} copies, {int(mine.sum())} of 1 MB or more, "
                          f"at {gbps:.1f} GB/s", False)


def _from_calibration(device, direction: str) -> CopyRate | None:
    from advisor.knowledge.calibrate import CalibrationError, load_calibration

    try:
        calibration = load_calibration()
    except CalibrationError:
        return None
    if calibration is None or device is None:
        return None
    for entry in calibration.devices:
        if entry.kind == "gpu" and entry.skipped is None and entry.name == device.name:
            gbps = entry.host_copy_gbps.get(f"{direction} pinned")
            if gbps:
                return CopyRate(float(gbps), f"advisor calibrate on this machine's {entry.name} ({entry.measured}), "
                                             f"pinned {direction} at {gbps:.1f} GB/s", False)
    return None


def _from_knowledge(device, direction: str) -> CopyRate | None:
    from advisor.knowledge import hardware as kb

    profile = kb.match_device(device) if device is not None else None
    if profile is None or profile.host_link is None:
        return None
    gbps = profile.host_link.gbps * LINK_EFFICIENCY
    return CopyRate(gbps, f"an estimate: {LINK_EFFICIENCY:.0%} of the {profile.id}'s PCIe {profile.host_link.pcie} "
                          f"link per direction ({profile.host_link.gbps:g} GB/s, its datasheet), {gbps:.1f} GB/s",
                    True)
