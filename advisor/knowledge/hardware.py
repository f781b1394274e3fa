"""The hardware knowledge base: GPU profiles and tensor-core rules, read from knowledge/.

The figures live as data in ``knowledge/gpus.yaml`` and ``knowledge/tensor_cores.yaml``
(each with its source; see knowledge/README.md). This module validates them once, on
first use, and answers the questions rules and tables ask of them:

    gpu_profile(name)                  the profile for ``--gpu NAME`` (ids, device names
                                       and loose spellings: "A100", "h100 sxm")
    match_device(device)               the profile a session's DeviceInfo is, or None;
    device_match(device)               the same with how it matched, or why it did not
    peak_flops(profile, dtype, tensor_core)   FLOP/s for a dtype on tensor or CUDA cores
    memory_bandwidth(profile)          bytes/s
    tensor_core_rule(architecture, dtype)     the dimension multiples tensor cores need
    tensor_core_op(op_name)            whether an op can run on tensor cores, and which
                                       of its dimensions the multiples apply to
    uses_tensor_cores(kernel_name)     True / False / None (the name does not say)
    wave_quantization(m, n, ...)       tiles, waves and the efficiency lost to both

A broken knowledge file raises KnowledgeError with one line naming the file and the
first problem; nothing is guessed for a figure the files do not hold.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from advisor.errors import AdvisorError, UsageError
from advisor.paths import knowledge_dir
from advisor.session import DeviceInfo

__all__ = [
    "FIGURE_GROUPS",
    "MATRIX_UNITS",
    "UNIT_NAMES",
    "DeviceMatch",
    "GpuProfile",
    "KernelClass",
    "KnowledgeBase",
    "KnowledgeError",
    "Source",
    "TensorCoreOp",
    "TensorCoreRule",
    "WaveQuantization",
    "classify_kernel",
    "device_match",
    "gpu_profile",
    "gpu_profiles",
    "kernel_tile",
    "knowledge",
    "load_knowledge",
    "match_device",
    "memory_bandwidth",
    "normalize_dtype",
    "peak_flops",
    "tensor_core_op",
    "tensor_core_rule",
    "unit_names",
    "uses_tensor_cores",
    "wave_quantization",
]

GPUS_FILE = "gpus.yaml"
TENSOR_CORES_FILE = "tensor_cores.yaml"

Architecture = Literal["volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "cdna4"]
Vendor = Literal["nvidia", "amd"]
Dtype = Literal["fp16", "bf16", "tf32", "fp8", "int8"]
PeakUnit = Literal[
    "fp64", "fp32", "fp16", "bf16",
    "fp64_tensor", "fp32_tensor", "tf32_tensor", "fp16_tensor", "bf16_tensor", "fp8_tensor", "int8_tensor",
]
FigureGroup = Literal["chip", "compute_capability", "memory", "peak", "host_link"]
# The groups every profile sources; host_link is sourced where a profile gives one.
FIGURE_GROUPS: tuple[str, ...] = ("chip", "compute_capability", "memory", "peak")

Positive = Annotated[float, Field(gt=0)]


class KnowledgeError(AdvisorError):
    """A knowledge file that is missing or does not validate."""


# -- models: gpus.yaml ----------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where a figure comes from: the document's title as published, and its address."""

    title: str = Field(min_length=1)
    url: str = Field(pattern=r"^https?://\S+$")


class Unverified(_Strict):
    """A figure that could not be confirmed from an NVIDIA document, and why."""

    field: str
    why: str = Field(min_length=1)


# Fields of a profile an `unverified` entry may name.
_FIGURE_FIELDS = {
    "architecture", "compute_capability", "sm_count", "memory_gb", "memory_bandwidth_gbps",
    "l2_mb", "boost_clock_mhz", "peak_tflops", "gfx", "infinity_cache_mb", "lds_kb",
}


class HostLink(_Strict):
    """The GPU's link to the host, as its datasheet prints it: what a copy from pinned host
    memory can reach at best, per direction."""

    pcie: str = Field(pattern=r"^Gen[3-6] x(8|16)$", description="PCIe generation and lanes, e.g. 'Gen5 x16'.")
    gbps: Positive = Field(description="Per direction, GB/s: half the datasheet's bidirectional figure.")


class GpuProfile(_Strict):
    """One GPU model: its figures, the sources for each figure group, and the names that
    traces give it."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$", description="Stable id, e.g. a100-sxm4-80gb.")
    family: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Model family: a100, h100, ...")
    family_default: bool = Field(default=False, description="The family's profile for a bare family name ('A100').")
    names: list[str] = Field(min_length=1, description="Device names as traces and CUPTI write them.")
    vendor: Vendor = Field(default="nvidia", description="Who makes it: its units' names (SMs or compute units, "
                                                         "tensor or matrix cores) follow.")
    architecture: Architecture
    gfx: str | None = Field(default=None, pattern=r"^gfx[0-9a-f]+$", description="AMD's LLVM target (gfx942).")
    compute_capability: str = Field(pattern=r"^\d+\.\d+$", description="NVIDIA's compute capability; on AMD the "
                                                                         "GFXIP version ROCm reports in the same "
                                                                         "fields (9.4 for gfx942).")
    sm_count: int = Field(gt=0, description="Streaming multiprocessors; on AMD, compute units.")
    memory_gb: Positive
    memory_bandwidth_gbps: Positive
    l2_mb: Positive
    infinity_cache_mb: Positive | None = Field(default=None, description="AMD's memory-side last-level cache.")
    lds_kb: Positive | None = Field(default=None, description="Local data share (shared memory) per CU, KB.")
    boost_clock_mhz: Positive
    peak_tflops: dict[PeakUnit, Positive] = Field(description="Dense peak TFLOP/s (TOP/s for int8) per unit and dtype.")
    host_link: HostLink | None = Field(default=None, description="The link to the host, where the datasheet gives it.")
    name_only: bool = Field(default=False, description="Matched by its name only: its properties are another part's "
                                                       "(an H800 reports an H100's SMs and memory).")
    sources: dict[FigureGroup, Source]
    unverified: list[Unverified] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _host_link_sourced(self) -> GpuProfile:
        if self.host_link is not None and "host_link" not in self.sources:
            raise ValueError("host_link needs a source (sources: host_link: ...)")
        if (self.vendor == "amd") != self.architecture.startswith("cdna"):
            raise ValueError(f"architecture {self.architecture} is not {self.vendor}'s")
        if (self.gfx is not None) != (self.vendor == "amd"):
            raise ValueError("gfx (the LLVM target) is given for AMD parts, and only for them")
        return self

    @property
    def units(self) -> str:
        """What the vendor calls the multiprocessors: 'SMs' or 'CUs'."""
        return "CUs" if self.vendor == "amd" else "SMs"

    @property
    def matrix_units(self) -> str:
        """What the vendor calls the matrix units: 'tensor cores' or 'matrix cores'."""
        return "matrix cores" if self.vendor == "amd" else "tensor cores"

    @property
    def label(self) -> str:
        """The architecture as its vendor names it: 'gfx942, CDNA 3'; 'sm 9.0' (NVIDIA's
        compute capability says it)."""
        if self.vendor == "amd":
            return f"{self.gfx}, {self.architecture.upper().replace('CDNA', 'CDNA ')}"
        return f"sm {self.compute_capability}"

    @field_validator("sources")
    @classmethod
    def _every_group_sourced(cls, value: dict[str, Source]) -> dict[str, Source]:
        missing = [g for g in FIGURE_GROUPS if g not in value]
        if missing:
            raise ValueError(f"no source for figure group(s) {', '.join(missing)}")
        return value

    @field_validator("peak_tflops")
    @classmethod
    def _has_fp32(cls, value: dict[str, float]) -> dict[str, float]:
        if "fp32" not in value:
            raise ValueError("peak_tflops needs at least fp32 (CUDA cores)")
        return value

    @field_validator("unverified")
    @classmethod
    def _known_fields(cls, value: list[Unverified]) -> list[Unverified]:
        for entry in value:
            base = entry.field.split(".", 1)[0]
            if base not in _FIGURE_FIELDS:
                raise ValueError(f"unverified names {entry.field!r}, which is not a figure of a profile")
        return value

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    def unverified_why(self, figure: str) -> str | None:
        """Why ``figure`` (e.g. 'sm_count', 'peak_tflops') is unverified, or None."""
        for entry in self.unverified:
            if entry.field == figure or figure.startswith(entry.field + "."):
                return entry.why
        return None

    def all_names(self) -> list[str]:
        return [self.id, *self.names]


class _GpuFile(_Strict):
    format: Literal["advisor-gpus/1"]
    sources: dict[str, Source]
    gpus: list[GpuProfile] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> _GpuFile:
        seen_ids: set[str] = set()
        seen_names: dict[str, str] = {}
        defaults: dict[str, list[str]] = {}
        for gpu in self.gpus:
            if gpu.id in seen_ids:
                raise ValueError(f"duplicate id {gpu.id!r}")
            seen_ids.add(gpu.id)
            for name in gpu.all_names():
                key = _normalize(name)
                if not key:
                    raise ValueError(f"{gpu.id}: name {name!r} is empty once normalised")
                if seen_names.get(key, gpu.id) != gpu.id:
                    raise ValueError(f"name {name!r} belongs to both {seen_names[key]} and {gpu.id}")
                seen_names[key] = gpu.id
            defaults.setdefault(gpu.family, [])
            if gpu.family_default:
                defaults[gpu.family].append(gpu.id)
        for family, ids in defaults.items():
            if len(ids) != 1:
                raise ValueError(f"family {family!r} needs exactly one family_default profile, has {len(ids)}"
                                 + (f" ({', '.join(ids)})" if ids else ""))
        return self


# -- models: tensor_cores.yaml -------------------------------------------------------------------


class DtypeRule(_Strict):
    required_multiple: int = Field(gt=0)
    preferred_multiple: int = Field(gt=0)

    @model_validator(mode="after")
    def _preferred_is_multiple(self) -> DtypeRule:
        if self.preferred_multiple % self.required_multiple:
            raise ValueError(f"preferred_multiple {self.preferred_multiple} is not a multiple of "
                             f"required_multiple {self.required_multiple}")
        return self


Tile = tuple[Annotated[int, Field(gt=0)], Annotated[int, Field(gt=0)]]


class ArchitectureRules(_Strict):
    compute_capabilities: list[Annotated[str, Field(pattern=r"^\d+\.\d+$")]] = Field(min_length=1)
    dtypes: dict[Dtype, DtypeRule] = Field(min_length=1)
    preferred_source: str
    preferred_why: str = ""
    unverified: list[Unverified] = Field(default_factory=list)
    tiles: list[Tile] = Field(min_length=1)
    default_tile: Tile
    tile_source: str
    notes: list[str] = Field(default_factory=list)


class WaveRules(_Strict):
    source: str
    tiles_per_sm: int = Field(gt=0)
    why_one_tile_per_sm: str = ""


OpKind = Literal["gemm", "conv", "attention"]


class _OpEntry(_Strict):
    name: str = Field(min_length=1)
    kind: OpKind
    dtypes: list[Dtype] | None = None


class KernelPattern(_Strict):
    pattern: str
    tensor_core: bool | None
    why: str = Field(min_length=1)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value, re.IGNORECASE)
        except re.error as exc:
            raise ValueError(f"pattern {value!r} is not a valid regular expression: {exc}") from None
        return value


class _TensorCoreFile(_Strict):
    format: Literal["advisor-tensor-cores/1"]
    sources: dict[str, Source]
    dtype_bytes: dict[Dtype, Annotated[int, Field(gt=0)]]
    wave_quantization: WaveRules
    architectures: dict[Architecture, ArchitectureRules]
    ops: list[_OpEntry] = Field(min_length=1)
    op_dims: dict[OpKind, list[str]]
    kernel_patterns: list[KernelPattern] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> _TensorCoreFile:
        refs = [("wave_quantization.source", self.wave_quantization.source)]
        for arch, rules in self.architectures.items():
            refs += [(f"{arch}.preferred_source", rules.preferred_source), (f"{arch}.tile_source", rules.tile_source)]
            for dtype in rules.dtypes:
                if dtype not in self.dtype_bytes:
                    raise ValueError(f"{arch}: dtype {dtype} has no entry in dtype_bytes")
        for where, ref in refs:
            if ref not in self.sources:
                raise ValueError(f"{where} names source {ref!r}, which is not under sources")
        for kind in ("gemm", "conv", "attention"):
            if kind not in self.op_dims:
                raise ValueError(f"op_dims has no entry for {kind}")
        names = [op.name for op in self.ops]
        if len(names) != len(set(names)):
            raise ValueError("ops lists an op twice")
        return self


# -- what the functions return -------------------------------------------------------------------


@dataclass(frozen=True)
class TensorCoreRule:
    """The dimension rule for one architecture and dtype. Multiples are in elements."""

    architecture: str
    dtype: str
    element_bytes: int
    required_multiple: int
    preferred_multiple: int
    tiles: tuple[tuple[int, int], ...]
    default_tile: tuple[int, int]
    source: Source
    preferred_why: str = ""
    preferred_unverified: str | None = None  # why the preferred multiple is not confirmed
    notes: tuple[str, ...] = ()

    @property
    def required_bytes(self) -> int:
        return self.required_multiple * self.element_bytes

    @property
    def preferred_bytes(self) -> int:
        return self.preferred_multiple * self.element_bytes

    def meets_required(self, size: int) -> bool:
        return size % self.required_multiple == 0

    def meets_preferred(self, size: int) -> bool:
        return size % self.preferred_multiple == 0


@dataclass(frozen=True)
class TensorCoreOp:
    """An op that can run on tensor cores and the dimensions the multiples apply to."""

    name: str
    kind: str  # gemm, conv, attention
    dims: tuple[str, ...]
    dtypes: tuple[str, ...] | None  # None: any tensor-core dtype


@dataclass(frozen=True)
class KernelClass:
    """What a kernel's name says about tensor-core use: True, False or None (unknown),
    with the pattern that decided and why."""

    tensor_core: bool | None
    pattern: str = ""
    why: str = ""


@dataclass(frozen=True)
class DeviceMatch:
    """The outcome of matching a session's device: the profile and how it was found, or
    None and why not (tables and rules show ``why`` to the user)."""

    profile: GpuProfile | None
    how: str = ""
    why: str = ""


@dataclass(frozen=True)
class WaveQuantization:
    """Tiles a GEMM's output splits into and how many waves of the GPU's SMs they need."""

    tiles: int
    waves: int
    slots: int  # tiles one wave runs: SMs x tiles per SM
    wave_efficiency: float  # tiles / (waves x slots): 1.0 when the last wave is full
    tile_efficiency: float  # useful share of the padded tiles (tile quantisation)

    @property
    def efficiency(self) -> float:
        return self.wave_efficiency * self.tile_efficiency


# -- loading -------------------------------------------------------------------------------------


@dataclass
class KnowledgeBase:
    """Both knowledge files, validated, with the indexes the look-ups use."""

    directory: Path
    gpus: list[GpuProfile]
    gpu_sources: dict[str, Source]
    tensor_cores: _TensorCoreFile
    _by_name: dict[str, GpuProfile] = field(default_factory=dict)
    _tokens: dict[str, set[str]] = field(default_factory=dict)
    _patterns: list[tuple[re.Pattern[str], KernelPattern]] = field(default_factory=list)
    _ops: dict[str, TensorCoreOp] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for gpu in self.gpus:
            tokens: set[str] = set(_normalize(gpu.family).split("-"))
            for name in gpu.all_names():
                key = _normalize(name)
                self._by_name[key] = gpu
                tokens.update(key.split("-"))
            self._tokens[gpu.id] = tokens
        self._patterns = [(re.compile(p.pattern, re.IGNORECASE), p) for p in self.tensor_cores.kernel_patterns]
        dims = self.tensor_cores.op_dims
        for op in self.tensor_cores.ops:
            self._ops[op.name] = TensorCoreOp(op.name, op.kind, tuple(dims[op.kind]),
                                              tuple(op.dtypes) if op.dtypes else None)

    def ids(self) -> list[str]:
        return [g.id for g in self.gpus]

    def by_id(self, gpu_id: str) -> GpuProfile | None:
        return next((g for g in self.gpus if g.id == gpu_id), None)


def load_knowledge(directory: str | Path | None = None) -> KnowledgeBase:
    """Read and validate both knowledge files from ``directory`` (advisor's own
    knowledge/ by default). Raises KnowledgeError with one line on any problem."""
    folder = Path(directory) if directory is not None else knowledge_dir()
    gpus_path, tc_path = folder / GPUS_FILE, folder / TENSOR_CORES_FILE
    tensor_cores = _validate(_TensorCoreFile, _read_yaml(tc_path), tc_path)
    raw_gpus = _read_yaml(gpus_path)
    gpu_file = _validate(_GpuFile, _resolve_gpus(raw_gpus, gpus_path), gpus_path)
    for gpu in gpu_file.gpus:
        rules = tensor_cores.architectures.get(gpu.architecture)
        if rules is None:
            raise KnowledgeError(f"{gpus_path}: {gpu.id} is {gpu.architecture}, which {tc_path.name} does not describe")
        if gpu.compute_capability not in rules.compute_capabilities:
            raise KnowledgeError(f"{gpus_path}: {gpu.id} has compute capability {gpu.compute_capability}, which "
                                 f"{tc_path.name} does not list for {gpu.architecture}")
    return KnowledgeBase(folder, list(gpu_file.gpus), dict(gpu_file.sources), tensor_cores)


@functools.lru_cache(maxsize=1)
def knowledge() -> KnowledgeBase:
    """advisor's own knowledge base, loaded once."""
    return load_knowledge()


# libyaml's safe loader where PyYAML was built with it: the knowledge files are read on
# every diagnosis, and the pure-Python parser takes a tenth of a second over them.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KnowledgeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        data = yaml.load(text, Loader=_LOADER)  # a safe loader, libyaml's where built
    except yaml.YAMLError as exc:
        raise KnowledgeError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise KnowledgeError(f"{path}: expected a mapping at the top, found {type(data).__name__}")
    return data


def _validate(model: type[BaseModel], data: Any, path: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _location(first.get("loc", ()), data)
        message = first.get("msg", "invalid").removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
        raise KnowledgeError(f"{path}: {where}{': ' if where else ''}{message}{more}") from None


def _location(loc: tuple, data: Any) -> str:
    """A pydantic error location as the user would find it in the file:
    ``gpus[3] (a100-sxm4-80gb).sm_count``."""
    parts: list[str] = []
    node = data
    for key in loc:
        if isinstance(key, int):
            label = f"[{key}]"
            if isinstance(node, list) and key < len(node):
                node = node[key]
                if isinstance(node, dict) and isinstance(node.get("id"), str):
                    label += f" ({node['id']})"
            parts.append(label)
        elif key != "[key]":  # pydantic's marker for "the key itself was wrong"
            parts.append(("." if parts else "") + str(key))
            node = node.get(key) if isinstance(node, dict) else None
    return "".join(parts)


def _resolve_gpus(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """Apply ``inherits`` and turn source references into Source records, so the model
    sees complete profiles. Problems here are file problems, reported like the model's."""
    sources = raw.get("sources")
    entries = raw.get("gpus")
    if not isinstance(sources, dict) or not isinstance(entries, list):
        return raw  # the model reports what is missing
    by_id = {e.get("id"): e for e in entries if isinstance(e, dict)}

    def resolved(entry: dict[str, Any], chain: tuple[str, ...]) -> dict[str, Any]:
        parent_id = entry.get("inherits")
        if parent_id is None:
            return dict(entry)
        if parent_id in chain:
            raise KnowledgeError(f"{path}: gpu {entry.get('id')!r} inherits from itself through {' -> '.join(chain)}")
        parent = by_id.get(parent_id)
        if parent is None:
            raise KnowledgeError(f"{path}: gpu {entry.get('id')!r} inherits from unknown id {parent_id!r}")
        merged = {**resolved(parent, chain + (parent_id,)), **entry}
        merged.pop("inherits", None)
        return merged

    gpus = []
    for entry in entries:
        if not isinstance(entry, dict):
            gpus.append(entry)
            continue
        full = resolved(entry, (str(entry.get("id")),))
        refs = full.get("sources")
        if isinstance(refs, dict):
            expanded = {}
            for group, ref in refs.items():
                if isinstance(ref, str):
                    if ref not in sources:
                        raise KnowledgeError(f"{path}: gpu {full.get('id')!r} names source {ref!r} for {group}, "
                                             "which is not under sources")
                    expanded[group] = sources[ref]
                else:
                    expanded[group] = ref
            full["sources"] = expanded
        gpus.append(full)
    return {**raw, "gpus": gpus}


# -- names -----------------------------------------------------------------------------------------

# Words every vendor name carries that say nothing about which part it is.
_NOISE_WORDS = {"nvidia", "tesla", "geforce", "amd", "instinct"}


def _normalize(name: str) -> str:
    words = re.split(r"[^a-z0-9]+", str(name).lower())
    return "-".join(w for w in words if w and w not in _NOISE_WORDS)


def _token_matches(query: str, token: str) -> bool:
    # "sxm" matches "sxm4"/"sxm5", but "a10" does not match "a100": a trailing digit
    # extends a word only after a letter.
    if query == token:
        return True
    return query[-1:].isalpha() and token.startswith(query) and token[len(query):].isdigit()


def _name_candidates(kb: KnowledgeBase, name: str) -> tuple[list[GpuProfile], str]:
    """Profiles a name may mean, most specific rule first: an exact id or device name; a
    device name contained in the given one ('NVIDIA A100-SXM4-40GB MIG 3g.20gb'); then a
    loose spelling whose every word belongs to the profile ('a100 80gb', 'H100 SXM')."""
    key = _normalize(name)
    if not key:
        return [], ""
    if key in kb._by_name:
        return [kb._by_name[key]], "name"
    query = key.split("-")
    contained = []
    for gpu in kb.gpus:
        best = max((len(_normalize(n).split("-")) for n in gpu.all_names()
                    if set(_normalize(n).split("-")) <= set(query)), default=0)
        if best:
            contained.append((best, gpu))
    if contained:
        top = max(b for b, _ in contained)
        return [g for b, g in contained if b == top], "name"
    loose = [g for g in kb.gpus
             if all(any(_token_matches(q, t) for t in kb._tokens[g.id]) for q in query)]
    return loose, "loose name"


def gpu_profiles() -> list[GpuProfile]:
    """Every profile in the knowledge base, in file order."""
    return list(knowledge().gpus)


def gpu_profile(name: str) -> GpuProfile:
    """The profile ``--gpu NAME`` means: an id ('a100-sxm4-80gb'), a device name as traces
    write it ('NVIDIA A100-SXM4-80GB'), or a loose spelling ('A100', 'a100-80gb',
    'H100 SXM', 'h100'), case-insensitively. A bare family name means the family's default
    board. Raises UsageError with one line listing the known ids when nothing fits."""
    kb = knowledge()
    candidates, _how = _name_candidates(kb, name)
    if len(candidates) == 1:
        return candidates[0]
    if len(candidates) > 1:
        defaults = [g for g in candidates if g.family_default]
        if len(defaults) == 1:
            return defaults[0]
        raise UsageError(f"--gpu {name!r} fits several GPUs ({', '.join(g.id for g in candidates)}); "
                         "give one of these ids")
    raise UsageError(f"unknown GPU {name!r}; known ids: {', '.join(kb.ids())}")


# -- matching a session's device ---------------------------------------------------------------

# A device reports a little less memory than its name says (the driver reserves some, ECC
# on GDDR takes 1/16); nominal sizes of HBM parts are in GiB.
_MEMORY_LOW, _MEMORY_HIGH = 0.85, 1.05


def _contradictions(gpu: GpuProfile, device: DeviceInfo) -> list[str]:
    out = []
    cc = (device.compute_capability or "").strip()
    if cc and cc != gpu.compute_capability:
        out.append(f"compute capability {cc} (the {gpu.id} has {gpu.compute_capability})")
    if device.sm_count is not None and device.sm_count > 0 and device.sm_count != gpu.sm_count:
        out.append(f"{device.sm_count} SMs (the {gpu.id} has {gpu.sm_count})")
    if device.total_memory_bytes:
        gib = device.total_memory_bytes / 2**30
        if not _MEMORY_LOW * gpu.memory_gb <= gib <= _MEMORY_HIGH * gpu.memory_gb:
            out.append(f"{gib:.1f} GiB of memory (the {gpu.id} has {gpu.memory_gb:g} GB)")
    return out


def _same_figures(gpus: list[GpuProfile]) -> bool:
    first = gpus[0]
    return all(g.peak_tflops == first.peak_tflops and g.memory_bandwidth_gbps == first.memory_bandwidth_gbps
               and g.sm_count == first.sm_count for g in gpus[1:])


def _narrow(candidates: list[GpuProfile], device: DeviceInfo) -> list[GpuProfile]:
    """Break ties with what the device reports beyond name, SMs and capability: peak
    memory bandwidth (CUPTI gives it) and memory size."""
    if len(candidates) > 1 and device.memory_bandwidth_gbps:
        bw = device.memory_bandwidth_gbps
        best = min(abs(g.memory_bandwidth_gbps - bw) / bw for g in candidates)
        if best <= 0.15:
            candidates = [g for g in candidates if abs(g.memory_bandwidth_gbps - bw) / bw <= best + 0.02]
    if len(candidates) > 1 and device.total_memory_bytes:
        gib = device.total_memory_bytes / 2**30
        best = min(abs(g.memory_gb - gib) for g in candidates)
        candidates = [g for g in candidates if abs(g.memory_gb - gib) <= best + 1.0]
    return candidates


def _describe(device: DeviceInfo) -> str:
    facts = []
    if device.compute_capability:
        facts.append(f"compute capability {device.compute_capability}")
    if device.sm_count:
        facts.append(f"{device.sm_count} SMs")
    if device.total_memory_bytes:
        facts.append(f"{device.total_memory_bytes / 2**30:.1f} GiB")
    name = repr(device.name) if device.name else f"device {device.id}"
    return name + (f" ({', '.join(facts)})" if facts else "")


def device_match(device: DeviceInfo) -> DeviceMatch:
    """Find the profile for a session's device: by name first, then by compute capability,
    SM count and memory (with memory bandwidth as a tie-breaker). A name whose profile the
    reported properties contradict is not matched. Returns the profile and how it was found,
    or None and why not."""
    kb = knowledge()
    if device.kind != "gpu":
        return DeviceMatch(None, why=f"{_describe(device)} is not a GPU; the knowledge base holds GPU profiles only")
    named, how = _name_candidates(kb, device.name) if device.name else ([], "")
    has_props = bool(device.compute_capability) and bool(device.sm_count)
    if named:
        fitting = [g for g in named if not _contradictions(g, device)]
        if not fitting:
            problems = "; ".join(_contradictions(named[0], device))
            return DeviceMatch(None, why=f"{_describe(device)}: the name suggests {', '.join(g.id for g in named)}, "
                                         f"but the device reports {problems}; pass --gpu ID to choose a profile")
        candidates = fitting
        if has_props or device.total_memory_bytes:
            how += " and properties"
    else:
        if not has_props:
            return DeviceMatch(None, why=f"unknown device {_describe(device)}: its name is not in the knowledge base "
                                         "and the trace gives no compute capability and SM count to match on; "
                                         f"pass --gpu with one of: {', '.join(kb.ids())}")
        candidates = [g for g in kb.gpus if not g.name_only and not _contradictions(g, device)]
        how = "properties"
        if not candidates:
            return DeviceMatch(None, why=f"unknown device {_describe(device)}: no GPU in the knowledge base has "
                                         f"these properties; pass --gpu with one of: {', '.join(kb.ids())}")
    candidates = _narrow(candidates, device)
    if len(candidates) == 1:
        return DeviceMatch(candidates[0], how=how)
    if _same_figures(candidates):
        # Boards that differ only in form factor: any of them gives the same answers.
        chosen = next((g for g in candidates if g.family_default), candidates[0])
        return DeviceMatch(chosen, how=f"{how} (also fits {', '.join(g.id for g in candidates if g is not chosen)}, "
                                       "which have the same figures)")
    return DeviceMatch(None, why=f"{_describe(device)} fits several GPUs with different figures "
                                 f"({', '.join(g.id for g in candidates)}); pass --gpu ID to choose one")


def match_device(device: DeviceInfo) -> GpuProfile | None:
    """The profile a session's device is, or None (``device_match(device).why`` says why)."""
    return device_match(device).profile


# -- peaks ------------------------------------------------------------------------------------------

_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32", "single": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32", "tensorfloat-32": "tf32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp64": "fp64", "float64": "fp64", "double": "fp64", "f64": "fp64",
    "int8": "int8", "signed char": "int8", "qint8": "int8", "i8": "int8",
    "fp8": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}


def normalize_dtype(dtype: Any) -> str | None:
    """A dtype as advisor names it (fp32, tf32, fp16, bf16, fp64, int8, fp8) from torch's
    spellings ('torch.float16', 'c10::BFloat16', 'float', 'signed char',
    'c10::Float8_e4m3fn'), or None for anything else."""
    text = str(dtype).strip().lower()
    for prefix in ("torch.", "c10::", "at::"):
        text = text.removeprefix(prefix)
    if text.startswith("float8"):
        return "fp8"
    return _DTYPE_ALIASES.get(text)


_TENSOR_UNIT = {"fp32": "tf32_tensor", "tf32": "tf32_tensor", "fp16": "fp16_tensor", "bf16": "bf16_tensor",
                "fp8": "fp8_tensor", "int8": "int8_tensor", "fp64": "fp64_tensor"}
_CUDA_CORE_UNIT = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp64": "fp64"}


def _profile(profile: GpuProfile | str) -> GpuProfile:
    return profile if isinstance(profile, GpuProfile) else gpu_profile(profile)


def peak_flops(profile: GpuProfile | str, dtype: Any, tensor_core: bool) -> float | None:
    """Dense peak FLOP/s (OP/s for int8) of ``profile`` for ``dtype`` on tensor cores or on
    CUDA cores. An FP32 GEMM on NVIDIA's tensor cores runs as TF32, so (fp32,
    tensor_core=True) is the TF32 rate there; AMD's matrix cores run it as FP32, at the
    matrix FP32 rate. None where the part has no such unit (V100 bf16, FP8 before Ada) or the
    knowledge base holds no figure for it (CUDA-core FP16 on most parts)."""
    gpu = _profile(profile)
    name = normalize_dtype(dtype)
    if name is None:
        return None
    unit = (_TENSOR_UNIT if tensor_core else _CUDA_CORE_UNIT).get(name)
    if tensor_core and name == "fp32" and "fp32_tensor" in gpu.peak_tflops:
        unit = "fp32_tensor"  # AMD's matrix cores run FP32 GEMMs as FP32 (TF32 only when asked: dtype 'tf32')
    value = gpu.peak_tflops.get(unit) if unit else None
    return value * 1e12 if value is not None else None


# The names of a GPU's two kinds of unit, as the roofline tables state them: (general, matrix).
UNIT_NAMES = {"nvidia": ("cuda cores", "tensor cores"), "amd": ("vector units", "matrix cores")}
MATRIX_UNITS = frozenset(names[1] for names in UNIT_NAMES.values())


def unit_names(profile: GpuProfile | None) -> tuple[str, str]:
    """(general, matrix) unit names for ``profile``'s vendor (NVIDIA's where unknown)."""
    return UNIT_NAMES[profile.vendor if profile is not None else "nvidia"]


def memory_bandwidth(profile: GpuProfile | str) -> float:
    """Peak memory bandwidth in bytes/s."""
    return _profile(profile).memory_bandwidth_gbps * 1e9


# -- tensor-core rules -------------------------------------------------------------------------------


def _architecture(kb: KnowledgeBase, architecture: str | GpuProfile) -> str:
    if isinstance(architecture, GpuProfile):
        return architecture.architecture
    text = str(architecture).strip().lower()
    archs = kb.tensor_cores.architectures
    if text in archs:
        return text
    for arch, rules in archs.items():  # a compute capability: "8.0", "sm_80", "sm90"
        cc = re.fullmatch(r"(?:sm_?)?(\d+)\.?(\d)a?", text)
        if cc and f"{cc.group(1)}.{cc.group(2)}" in rules.compute_capabilities:
            return arch
    raise KnowledgeError(f"unknown GPU architecture {architecture!r}; known: {', '.join(archs)}")


def tensor_core_rule(architecture: str | GpuProfile, dtype: Any) -> TensorCoreRule | None:
    """The multiples GEMM M/N/K and conv C/K need on ``architecture`` (a name such as
    'ampere', a compute capability such as '8.0', or a profile) for ``dtype``. None where
    the architecture has no tensor-core path for the dtype (bf16 on Volta, int8 on Volta,
    fp8 before Ada). FP32 data reaches tensor cores only as TF32: ask for 'tf32'."""
    kb = knowledge()
    arch = _architecture(kb, architecture)
    rules = kb.tensor_cores.architectures[arch]
    name = normalize_dtype(dtype)
    if name not in rules.dtypes:
        return None
    entry = rules.dtypes[name]
    unverified = next((u.why for u in rules.unverified if u.field == "preferred_multiple"), None)
    return TensorCoreRule(
        architecture=arch,
        dtype=name,
        element_bytes=kb.tensor_cores.dtype_bytes[name],
        required_multiple=entry.required_multiple,
        preferred_multiple=entry.preferred_multiple,
        tiles=tuple(tuple(t) for t in rules.tiles),
        default_tile=tuple(rules.default_tile),
        source=kb.tensor_cores.sources[rules.preferred_source],
        preferred_why=rules.preferred_why,
        preferred_unverified=unverified,
        notes=tuple(rules.notes),
    )


def tensor_core_op(op_name: str) -> TensorCoreOp | None:
    """The op's tensor-core eligibility ('aten::mm', 'aten::conv2d', ...; the 'aten::'
    prefix may be left off), or None for an op that never runs on tensor cores."""
    ops = knowledge()._ops
    name = str(op_name).strip()
    return ops.get(name) or ops.get(f"aten::{name}")


@functools.lru_cache(maxsize=8192)
def classify_kernel(kernel_name: str) -> KernelClass:
    """What a kernel's name says about tensor-core use (first matching pattern of
    tensor_cores.yaml wins). Kernel names repeat a great deal, hence the cache."""
    for regex, entry in knowledge()._patterns:
        if regex.search(kernel_name):
            return KernelClass(entry.tensor_core, entry.pattern, entry.why)
    return KernelClass(None)


def uses_tensor_cores(kernel_name: str) -> bool | None:
    """True where the name shows a tensor-core kernel, False where it shows the CUDA-core
    path (sgemm, gemv, scudnn, ffma, simt ...), None where the name does not say (most
    non-GEMM kernels, Triton kernels)."""
    return classify_kernel(str(kernel_name)).tensor_core


# A GEMM kernel's output tile as its name says it: Tensile / hipBLASLt's macro tile
# (Cijk_..._MT256x112x64_MI16x16x1_...), cuBLAS's tile size (sm90_xmma_..._tilesize128x128x64)
# and older cuBLAS names (ampere_fp16_s16816gemm_fp16_256x128_ldg8_...).
_TILE_IN_NAME = re.compile(r"_MT(\d+)x(\d+)x\d+|tilesize(\d+)x(\d+)x\d+|gemm\w*?_(\d{2,3})x(\d{2,3})_")


def kernel_tile(name: str) -> tuple[int, int] | None:
    """The output tile (rows, columns) a GEMM kernel's name gives, or None where it
    gives none."""
    found = _TILE_IN_NAME.search(str(name))
    if found is None:
        return None
    values = [int(v) for v in found.groups() if v is not None]
    return (values[0], values[1]) if len(values) == 2 and values[0] > 0 and values[1] > 0 else None


def wave_quantization(m: int, n: int, *, sm_count: int, tile: tuple[int, int] | None = None,
                      batch: int = 1, tiles_per_sm: int | None = None) -> WaveQuantization:
    """Tile and wave quantisation of an M x N GEMM output (times ``batch``) cut into
    ``tile`` output tiles (128x128 unless given), run ``tiles_per_sm`` at a time on each of
    ``sm_count`` SMs (tensor_cores.yaml's wave_quantization.tiles_per_sm unless given)."""
    if m <= 0 or n <= 0 or batch <= 0 or sm_count <= 0:
        raise ValueError("m, n, batch and sm_count must be positive")
    tile_m, tile_n = tile or (128, 128)
    per_sm = tiles_per_sm or knowledge().tensor_cores.wave_quantization.tiles_per_sm
    rows, cols = math.ceil(m / tile_m), math.ceil(n / tile_n)
    tiles = rows * cols * batch
    slots = sm_count * per_sm
    waves = math.ceil(tiles / slots)
    return WaveQuantization(
        tiles=tiles,
        waves=waves,
        slots=slots,
        wave_efficiency=tiles / (waves * slots),
        tile_efficiency=(m * n) / (rows * tile_m * cols * tile_n),
    )
