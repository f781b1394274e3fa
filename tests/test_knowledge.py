"""The knowledge base: every GPU profile validates and cites a source per figure group,
device names from real traces match, unknown devices say why, tensor-core multiples,
kernel-name classification on real kernel names, peaks and wave quantisation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from advisor.errors import AdvisorError, UsageError
from advisor.knowledge import hardware as kb
from advisor.knowledge.hardware import (
    FIGURE_GROUPS,
    KnowledgeError,
    classify_kernel,
    device_match,
    gpu_profile,
    gpu_profiles,
    load_knowledge,
    match_device,
    memory_bandwidth,
    normalize_dtype,
    peak_flops,
    tensor_core_op,
    tensor_core_rule,
    uses_tensor_cores,
    wave_quantization,
)
from advisor.paths import knowledge_dir
from advisor.session import DeviceInfo
from tests.conftest import shared_trace

REQUIRED_IDS = {
    "v100-sxm2-32gb", "v100-sxm2-16gb", "v100-pcie-32gb", "v100-pcie-16gb", "t4", "a10",
    "a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "l4", "l40s",
    "h100-sxm", "h100-pcie", "h200", "b200", "rtx-4090",
    # the parts real traces come from that the base lacked
    "h800", "h20", "gb200", "gb10", "a30", "a40", "rtx-2080-ti", "rtx-3090", "rtx-5090", "rtx-6000-ada",
    # AMD Instinct
    "mi210", "mi250", "mi250x", "mi300x", "mi300a", "mi325x", "mi350x", "mi355x",
}

# FP32 lanes per SM: GA100, Turing and Volta have 64, the rest 128. AMD's compute units:
# CDNA 2 runs 128 FP32 FLOPS per clock per CU (64 lanes), CDNA 3 and 4 256 (the ROCm tables).
FP32_LANES = {"volta": 64, "turing": 64, "ampere": 128, "ada": 128, "hopper": 128, "blackwell": 128,
              "cdna2": 64, "cdna3": 128, "cdna4": 128}
# FP16 (and BF16) matrix FLOPS per clock per compute unit, from the ROCm MI250, MI300 and
# MI350 tables: the matrix peak is CUs x this x clock.
AMD_FP16_PER_CU = {"cdna2": 1024, "cdna3": 2048, "cdna4": 4096}


# -- the data itself ----------------------------------------------------------------------------


def test_every_listed_device_is_there():
    ids = {p.id for p in gpu_profiles()}
    assert REQUIRED_IDS <= ids, f"missing: {sorted(REQUIRED_IDS - ids)}"


@pytest.mark.parametrize("profile", gpu_profiles(), ids=lambda p: p.id)
def test_every_profile_cites_a_source_for_each_figure_group(profile):
    for group in FIGURE_GROUPS:
        source = profile.sources[group]
        assert source.title.strip() and source.url.startswith("https://"), (profile.id, group)
    for entry in profile.unverified:
        assert len(entry.why) > 20, f"{profile.id}: unverified {entry.field} needs a real reason"


@pytest.mark.parametrize("profile", gpu_profiles(), ids=lambda p: p.id)
def test_figures_agree_with_each_other(profile):
    peaks = profile.peak_tflops
    # FP32 peak = SMs x lanes x 2 x clock: catches a wrong SM count, clock or FP32 figure.
    lanes = 64 if profile.compute_capability == "8.0" else FP32_LANES[profile.architecture]
    derived = profile.sm_count * lanes * 2 * profile.boost_clock_mhz * 1e6 / 1e12
    assert derived == pytest.approx(peaks["fp32"], rel=0.03)
    # Dense figures throughout: a sparse figure beside dense ones breaks these ratios.
    if "tf32_tensor" in peaks:
        assert peaks["fp16_tensor"] / peaks["tf32_tensor"] == pytest.approx(2, rel=0.03)
    if "bf16_tensor" in peaks:
        assert peaks["bf16_tensor"] == peaks["fp16_tensor"]
    if "fp8_tensor" in peaks:
        assert peaks["fp8_tensor"] / peaks["fp16_tensor"] == pytest.approx(2, rel=0.03)
    if "fp16_tensor" in peaks:
        assert peaks["fp16_tensor"] > peaks["fp32"]
    else:  # a part whose vendor prints no tensor-core rate but FP4's (GB10): none kept, none guessed
        assert not any(key.endswith("_tensor") for key in peaks) and profile.notes
    if profile.vendor == "amd":
        # Matrix FP16 = CUs x FLOPS per clock per CU x clock (the ROCm tables' rule).
        derived = profile.sm_count * AMD_FP16_PER_CU[profile.architecture] * profile.boost_clock_mhz * 1e6 / 1e12
        assert derived == pytest.approx(peaks["fp16_tensor"], rel=0.03)


def test_units_a_part_lacks_are_absent():
    v100 = gpu_profile("v100")
    assert {"tf32_tensor", "bf16_tensor", "fp8_tensor", "int8_tensor"}.isdisjoint(v100.peak_tflops)
    for profile in gpu_profiles():
        if not any(key.endswith("_tensor") for key in profile.peak_tflops):
            continue  # no tensor-core rate printed (GB10)
        has_fp8 = "fp8_tensor" in profile.peak_tflops
        assert has_fp8 == (profile.architecture in ("ada", "hopper", "blackwell", "cdna3", "cdna4")), profile.id
        # TF32 from Ampere on; AMD's XF32 on CDNA 3 only (CDNA 2 has none, CDNA 4 dropped it).
        assert ("tf32_tensor" in profile.peak_tflops) == (
            profile.architecture not in ("volta", "turing", "cdna2", "cdna4")), profile.id
        # AMD's matrix cores run FP32 GEMMs as FP32: a matrix FP32 rate for every AMD part, none for NVIDIA's.
        assert ("fp32_tensor" in profile.peak_tflops) == (profile.vendor == "amd"), profile.id


def test_datasheet_figures_for_a_few_parts():
    a100 = gpu_profile("a100-sxm4-80gb")
    assert (a100.sm_count, a100.memory_bandwidth_gbps, a100.l2_mb) == (108, 2039, 40)
    assert a100.peak_tflops["fp16_tensor"] == 312 and a100.peak_tflops["tf32_tensor"] == 156
    assert gpu_profile("a100-sxm4-40gb").memory_bandwidth_gbps == 1555
    h100 = gpu_profile("h100-sxm")
    assert (h100.sm_count, h100.memory_bandwidth_gbps, h100.compute_capability) == (132, 3350, "9.0")
    assert gpu_profile("h100-pcie").sm_count == 114


def test_amd_figures_are_the_rocm_documents():
    """The ROCm documentation's tables: MI300X (mi300.md), MI250 (mi250.md, per GCD: half
    the module), MI355X and MI350X (mi350.rst); compute units, L2 and targets from the GPU
    specifications table."""
    mi300x = gpu_profile("MI300X")
    assert (mi300x.vendor, mi300x.gfx, mi300x.architecture, mi300x.compute_capability) == (
        "amd", "gfx942", "cdna3", "9.4")
    assert (mi300x.sm_count, mi300x.memory_gb, mi300x.memory_bandwidth_gbps, mi300x.l2_mb, mi300x.lds_kb) == (
        304, 192, 5300, 32, 64)
    assert mi300x.peak_tflops == {"fp64": 81.7, "fp64_tensor": 163.4, "fp32": 163.4, "fp32_tensor": 163.4,
                                  "tf32_tensor": 653.7, "fp16_tensor": 1307.4, "bf16_tensor": 1307.4,
                                  "fp8_tensor": 2614.9, "int8_tensor": 2614.9}
    mi250 = gpu_profile("mi250")
    assert (mi250.sm_count, mi250.gfx, mi250.peak_tflops["fp16_tensor"], mi250.peak_tflops["fp64_tensor"]) == (
        104, "gfx90a", 181, 45.3)
    assert gpu_profile("mi250x").sm_count == 110 and gpu_profile("mi210").sm_count == 104
    mi355x = gpu_profile("mi355x")
    assert (mi355x.gfx, mi355x.sm_count, mi355x.memory_gb, mi355x.memory_bandwidth_gbps, mi355x.lds_kb) == (
        "gfx950", 256, 288, 8000, 160)
    assert mi355x.peak_tflops["fp16_tensor"] == 2500 and mi355x.peak_tflops["fp32"] == 157.3
    assert gpu_profile("mi350x").peak_tflops["fp64"] == 72.1
    assert gpu_profile("mi300a").sm_count == 228 and gpu_profile("mi325x").memory_gb == 256


def test_an_amd_fp32_gemm_on_matrix_cores_is_judged_at_the_matrix_fp32_rate_not_tf32():
    mi300x, mi250x, h100 = gpu_profile("mi300x"), gpu_profile("mi250x"), gpu_profile("h100-sxm")
    assert peak_flops(mi300x, "fp32", tensor_core=True) == 163.4e12
    assert peak_flops(mi300x, "tf32", tensor_core=True) == 653.7e12
    assert peak_flops(mi250x, "fp32", tensor_core=True) == 47.9e12
    assert peak_flops(mi250x, "tf32", tensor_core=True) is None
    assert peak_flops(h100, "fp32", tensor_core=True) == 494.7e12  # NVIDIA's: TF32


def test_the_vendors_name_their_units():
    assert kb.unit_names(gpu_profile("mi300x")) == ("vector units", "matrix cores")
    assert kb.unit_names(gpu_profile("a100")) == ("cuda cores", "tensor cores")
    assert gpu_profile("mi300x").label == "gfx942, CDNA 3" and gpu_profile("mi250x").label == "gfx90a, CDNA 2"


def test_a_profile_s_vendor_and_architecture_must_agree(knowledge_copy):
    def amd_hopper(data):
        entry = next(g for g in data["gpus"] if g["id"] == "h100-sxm")
        entry["vendor"] = "amd"
    _edit_gpus(knowledge_copy, amd_hopper)
    with pytest.raises(KnowledgeError, match="not amd's"):
        load_knowledge(knowledge_copy)


def test_inherited_profiles_keep_their_parents_sources_and_override_the_rest():
    parent, child = gpu_profile("v100-sxm2-32gb"), gpu_profile("v100-sxm2-16gb")
    assert child.memory_gb == 16 and parent.memory_gb == 32
    assert child.sources == parent.sources and child.peak_tflops == parent.peak_tflops
    assert not child.family_default
    assert gpu_profile("v100-pcie-16gb").unverified_why("boost_clock_mhz")


def test_unverified_figures_say_why():
    b200 = gpu_profile("b200")
    assert "cudaGetDeviceProperties" in b200.unverified_why("sm_count")
    assert b200.unverified_why("peak_tflops.fp32") is None
    assert gpu_profile("a100").unverified_why("sm_count") is None


# -- broken files ---------------------------------------------------------------------------------


@pytest.fixture
def knowledge_copy(tmp_path) -> Path:
    folder = tmp_path / "knowledge"
    shutil.copytree(knowledge_dir(), folder)
    return folder


def _edit_gpus(folder: Path, edit) -> None:
    path = folder / "gpus.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_the_copy_loads_like_the_original(knowledge_copy):
    assert [p.id for p in load_knowledge(knowledge_copy).gpus] == [p.id for p in gpu_profiles()]


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["gpus"][0]["sources"].pop("memory"), "v100-sxm2-32gb"),
    (lambda d: d["gpus"][0].__setitem__("sm_count", -1), "sm_count"),
    (lambda d: d["gpus"][0]["sources"].__setitem__("peak", "no-such-source"), "no-such-source"),
    (lambda d: d["gpus"][1].__setitem__("inherits", "no-such-gpu"), "no-such-gpu"),
    (lambda d: d["gpus"][1].__setitem__("names", ["Tesla V100-SXM2-32GB"]), "belongs to both"),
    (lambda d: d["gpus"][1].__setitem__("family_default", True), "family_default"),
    (lambda d: d["gpus"][0]["peak_tflops"].__setitem__("fp4_tensor", 1), "fp4_tensor"),
    (lambda d: d["gpus"][0].__setitem__("compute_capability", "8.0"), "does not list for volta"),
    (lambda d: d["gpus"][0].__setitem__("unverified", [{"field": "colour", "why": "x"}]), "colour"),
])
def test_a_broken_gpu_file_raises_one_clear_line(knowledge_copy, edit, expected):
    _edit_gpus(knowledge_copy, edit)
    with pytest.raises(KnowledgeError) as raised:
        load_knowledge(knowledge_copy)
    message = str(raised.value)
    assert expected in message and "gpus.yaml" in message and "\n" not in message
    assert isinstance(raised.value, AdvisorError)


def test_invalid_yaml_and_missing_files_raise_clear_errors(knowledge_copy):
    (knowledge_copy / "tensor_cores.yaml").write_text("architectures: [unclosed\n")
    with pytest.raises(KnowledgeError, match=r"tensor_cores\.yaml: not valid YAML"):
        load_knowledge(knowledge_copy)
    (knowledge_copy / "tensor_cores.yaml").unlink()
    with pytest.raises(KnowledgeError, match="cannot be read"):
        load_knowledge(knowledge_copy)


def test_a_bad_kernel_pattern_is_reported(knowledge_copy):
    path = knowledge_copy / "tensor_cores.yaml"
    data = yaml.safe_load(path.read_text())
    data["kernel_patterns"][0]["pattern"] = "(unclosed"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(KnowledgeError, match=r"kernel_patterns\[0\].*not a valid regular expression"):
        load_knowledge(knowledge_copy)


# -- names: --gpu and device matching --------------------------------------------------------------


@pytest.mark.parametrize("name, expected", [
    ("a100-sxm4-80gb", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("A100", "a100-sxm4-80gb"),
    ("a100-80gb", "a100-sxm4-80gb"),
    ("a100 40gb sxm", "a100-sxm4-40gb"),
    ("H100 SXM", "h100-sxm"),
    ("h100", "h100-sxm"),
    ("H100 PCIe", "h100-pcie"),
    ("h200 nvl", "h200-nvl"),
    ("v100", "v100-sxm2-32gb"),
    ("RTX 4090", "rtx-4090"),
    ("4090", "rtx-4090"),
    ("a10", "a10"),
    ("L4", "l4"),
    ("l40s", "l40s"),
    ("B200", "b200"),
    ("Tesla T4", "t4"),
])
def test_gpu_option_accepts_ids_device_names_and_loose_spellings(name, expected):
    assert gpu_profile(name).id == expected


@pytest.mark.parametrize("name", ["A10G", "gaudi2", "", "nvidia", "a1000", "mi100"])
def test_an_unknown_gpu_option_lists_the_known_ids_in_one_line(name):
    with pytest.raises(UsageError) as raised:
        gpu_profile(name)
    message = str(raised.value)
    assert "unknown GPU" in message and "a100-sxm4-80gb" in message and "h100-sxm" in message
    assert "\n" not in message


def test_an_ambiguous_gpu_option_names_the_candidates():
    with pytest.raises(UsageError, match="v100-sxm2-16gb, v100-pcie-16gb"):
        gpu_profile("v100 16gb")


@pytest.mark.parametrize("trace, expected", [
    ("resnet50_v100_num_workers_0.pt.trace.json.gz", "v100-sxm2-32gb"),  # Tesla V100-DGXS-32GB
    ("ddp_cnn_a100_rank0.json.gz", "a100-sxm4-40gb"),  # NVIDIA A100-PG509-200
    ("bert_small_infer_h100.json.gz", "h100-sxm"),  # NVIDIA H100 80GB HBM3
    ("bert_small_infer_mi300.json.gz", "mi300x"),  # AMD Instinct MI300X VF (gfx942: computeMajor 9, minor 4)
    ("sglang_decode_mi300.json.gz", "mi300x"),  # AMD Instinct MI300X
])
def test_devices_in_real_traces_match_by_name_and_properties(trace, expected):
    from advisor.importers import load

    session = load(shared_trace(trace))
    gpus = session.gpu_devices()
    assert gpus
    for device in gpus:
        found = device_match(device)
        assert found.profile is not None and found.profile.id == expected, found.why
        assert found.how == "name and properties"


def _gpu(name="GPU 0", cc=None, sms=None, memory=None, bandwidth=None) -> DeviceInfo:
    return DeviceInfo(id=0, kind="gpu", name=name, compute_capability=cc, sm_count=sms,
                      total_memory_bytes=memory, memory_bandwidth_gbps=bandwidth)


def test_properties_match_a_device_whose_name_is_unknown():
    # (The H800 has the H100 SXM's properties: it is matched by its name only.)
    assert match_device(_gpu(cc="9.0", sms=132, memory=85_018_279_936)).id == "h100-sxm"
    assert match_device(_gpu(name="NVIDIA H800", cc="9.0", sms=132, memory=85_018_279_936)).id == "h800"
    # ROCm's GFXIP 9.0 with 104 compute units is an MI210 or an MI250 GCD, never a Hopper.
    assert match_device(_gpu(name="AMD Radeon Graphics", cc="9.0", sms=104, memory=68_702_699_520)).vendor == "amd"
    assert match_device(_gpu(cc="7.5", sms=40, memory=15_843_721_216)).id == "t4"
    # SXM4 and PCIe 40 GB boards share every figure that matters: either answer is right.
    found = device_match(_gpu(cc="8.0", sms=108, memory=42_297_524_224))
    assert found.profile.id == "a100-sxm4-40gb" and "a100-pcie-40gb" in found.how


def test_memory_bandwidth_breaks_a_tie_between_boards_with_different_figures():
    no_bandwidth = device_match(_gpu(cc="8.0", sms=108, memory=85_000_000_000))
    assert no_bandwidth.profile is None and "a100-sxm4-80gb" in no_bandwidth.why and "--gpu" in no_bandwidth.why
    assert match_device(_gpu(cc="8.0", sms=108, memory=85_000_000_000, bandwidth=1935)).id == "a100-pcie-80gb"
    assert match_device(_gpu(cc="8.0", sms=108, memory=85_000_000_000, bandwidth=2039)).id == "a100-sxm4-80gb"


@pytest.mark.parametrize("device, words", [
    (_gpu("NVIDIA A10G", "8.6", 80, 23_836_033_024), ["unknown device", "A10G", "80 SMs", "--gpu"]),
    (_gpu("GPU 0"), ["unknown device", "no compute capability"]),
    (_gpu("NVIDIA GeForce RTX 4090 D", "8.9", 114, 25_757_220_864), ["suggests rtx-4090", "114 SMs"]),
    (_gpu("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "8.0", 42, 20_937_965_568), ["a100-sxm4-40gb", "42 SMs"]),
    (DeviceInfo(id=-1, kind="cpu", name="host CPU"), ["not a GPU"]),
])
def test_a_device_that_cannot_be_matched_says_why(device, words):
    found = device_match(device)
    assert found.profile is None and match_device(device) is None
    for word in words:
        assert word in found.why
    assert "\n" not in found.why


# -- peaks -----------------------------------------------------------------------------------------------


def test_peak_flops_by_dtype_and_unit():
    a100 = gpu_profile("a100")
    assert peak_flops(a100, "fp16", tensor_core=True) == pytest.approx(312e12)
    assert peak_flops(a100, "c10::BFloat16", True) == pytest.approx(312e12)
    assert peak_flops(a100, "float", tensor_core=True) == pytest.approx(156e12)  # fp32 GEMM as TF32
    assert peak_flops(a100, "torch.float32", tensor_core=False) == pytest.approx(19.5e12)
    assert peak_flops(a100, "signed char", tensor_core=True) == pytest.approx(624e12)
    assert peak_flops(a100, "fp8", tensor_core=True) is None  # no FP8 before Ada
    assert peak_flops("v100", "bf16", tensor_core=True) is None
    assert peak_flops("h100", "c10::Float8_e4m3fn", tensor_core=True) == pytest.approx(1978.9e12)
    assert peak_flops("t4", "fp16", tensor_core=False) is None  # no figure kept: not guessed
    assert peak_flops(a100, "complex64", tensor_core=True) is None
    assert memory_bandwidth("a100-sxm4-40gb") == pytest.approx(1555e9)


@pytest.mark.parametrize("text, expected", [
    ("float", "fp32"), ("c10::Half", "fp16"), ("torch.bfloat16", "bf16"), ("double", "fp64"),
    ("c10::Float8_e5m2", "fp8"), ("signed char", "int8"), ("tf32", "tf32"), ("long int", None), ("bool", None),
])
def test_dtype_spellings(text, expected):
    assert normalize_dtype(text) == expected


# -- tensor-core rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, required", [("fp16", 8), ("bf16", 8), ("tf32", 4), ("int8", 16), ("fp8", 16)])
def test_required_multiples_are_sixteen_bytes(dtype, required):
    rule = tensor_core_rule("hopper", dtype)
    assert rule.required_multiple == required and rule.required_bytes == 16
    assert rule.meets_required(required * 3) and not rule.meets_required(required * 3 + 1)


def test_a100_prefers_128_byte_multiples_as_nvidias_guide_says():
    rule = tensor_core_rule("ampere", "fp16")
    assert (rule.required_multiple, rule.preferred_multiple, rule.preferred_bytes) == (8, 64, 128)
    assert "Matrix Multiplication Background" in rule.source.title
    assert tensor_core_rule("ampere", "tf32").preferred_multiple == 32
    assert tensor_core_rule("ampere", "int8").preferred_multiple == 128
    assert rule.meets_preferred(4096) and not rule.meets_preferred(4104)
    assert tensor_core_rule("hopper", "fp16").preferred_unverified  # carried over, and says so


def test_architectures_without_a_tensor_core_path_for_a_dtype_return_none():
    assert tensor_core_rule("volta", "bf16") is None
    assert tensor_core_rule("volta", "int8") is None
    assert tensor_core_rule("turing", "tf32") is None
    assert tensor_core_rule("ampere", "fp8") is None
    assert tensor_core_rule("ampere", "fp32") is None  # FP32 data reaches tensor cores only as TF32


def test_architecture_by_name_compute_capability_or_profile():
    assert tensor_core_rule("8.0", "fp16").architecture == "ampere"
    assert tensor_core_rule("sm_90", "fp8").architecture == "hopper"
    assert tensor_core_rule(gpu_profile("l4"), "fp8").architecture == "ada"
    assert tensor_core_rule("blackwell", "bf16").default_tile == (256, 128)
    with pytest.raises(KnowledgeError, match="unknown GPU architecture 'pascal'"):
        tensor_core_rule("pascal", "fp16")


def test_eligible_ops_and_their_dimensions():
    assert tensor_core_op("aten::mm").dims == ("M", "N", "K")
    assert tensor_core_op("addmm").kind == "gemm"
    assert tensor_core_op("aten::conv2d").dims == ("C", "K")
    assert tensor_core_op("aten::convolution_backward").kind == "conv"
    assert tensor_core_op("aten::scaled_dot_product_attention").dims == ("head_dim",)
    assert tensor_core_op("aten::_scaled_mm").dtypes == ("fp8",)
    assert tensor_core_op("aten::relu") is None
    for name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul"):
        assert tensor_core_op(name) is not None


# -- kernel names ---------------------------------------------------------------------------------------

REAL_KERNELS = [
    # MI300X and MI210 traces (hipBLASLt / Tensile, Composable Kernel, MIOpen, AITER, vLLM)
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x64x128_MI16x16x1_SN_LDSB1_AFC1_AG0_AFEM1_AFEM1_ASEM1_CB0_CD1_1_CLR1_CADS0", True),
    ("Cijk_Ailk_Bljk_BBS_BH_MT32x32x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1EM1_AMAS0_ASE_ASGT_ASLT_ASM", True),
    ("_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemm_bk0mk1_bk0nk1_mn_xdlops_bwd_weight", True),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_tb1x8x2x1_1x4x1x64_gkgs", True),
    ("aiter::fmha_fwd_hd128_bf16_rtz", True),
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1, 128, 256, false, 4, 1>", True),
    ("Cijk_Ailk_Bljk_SB_MT64x64x8_SE_K1", False),  # Tensile without a matrix instruction: vector units
    ("batched_transpose_16x64_pack_1x4_ediv_1x2_half", None),
    # H100 traces (cuBLAS sm90, CUTLASS, FlashAttention)
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", True),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)", True),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_256x128_64x3_tn_align2>(cutlass_80_tensorop_bf16_s16816gemm_bf16_256x128_64x3_tn_align2::Params)", True),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, false, false>(pytorch_flash::Flash_fwd_params)", True),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)", False),
    # A100 trace (TF32 convolutions, CUTLASS GEMMs, fp32 SIMT GEMMs)
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer", True),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4::Params)", True),
    ("void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_128x128_32x4_nhwc_align4>(cutlass_tensorop_s1688fprop_optimized_tf32_128x128_32x4_nhwc_align4::Params)", True),
    ("ampere_sgemm_32x32_sliced1x4_tn", False),
    ("cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1", False),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, true, false>(cublasLt::cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*)", None),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", None),
    # V100 trace (fp32 ResNet-50: no tensor cores at all)
    ("volta_sgemm_64x64_nt", False),
    ("volta_scudnn_128x128_stridedB_splitK_small_nn_v1", False),
    ("void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)", False),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradDataParams<float, float>)", False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, at::detail::Array<char*, 3>)", None),
    # Hopper/Blackwell cuBLAS (nvjet), FP32 GEMMs with TF32 off, other families
    ("nvjet_hsh_192x192_64x3_2x1_v_bz_coopB_NTN", True),
    ("nvjet_sss_tf32_128x256_TNT", True),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x128x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", False),
    ("volta_h884gemm_64x64_ldg8_nn", True),
    ("turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_tn", True),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>, float, float)", False),
    ("cutlass3x_sm90_tensorop_s64x128x16gemm_f16_f16_f32_void_f16_128x128x64_1x1x1_0_tnn_align8_warpspecialized_cooperative_epi_tma", True),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", True),
    ("triton_poi_fused_add_0", None),
]


@pytest.mark.parametrize("name, expected", REAL_KERNELS, ids=[n[:60] for n, _ in REAL_KERNELS])
def test_kernel_names_tell_tensor_core_use(name, expected):
    assert uses_tensor_cores(name) is expected
    found = classify_kernel(name)
    assert found.tensor_core is expected
    if expected is not None:
        assert found.why and found.pattern


@pytest.mark.parametrize("trace, must_have", [
    ("resnet50_v100_num_workers_0.pt.trace.json.gz", {False}),
    ("ddp_cnn_a100_rank0.json.gz", {True, False}),
    ("qwen0.5b_infer_h100.json.gz", {True}),
    ("bert_small_infer_mi300.json.gz", {True}),  # hipBLASLt's Cijk_..._MI16x16x1 GEMMs
])
def test_kernels_of_real_traces_classify_as_their_runs_did(trace, must_have):
    from advisor.importers import load
    from advisor.session import text

    events = load(shared_trace(trace)).events
    names = set(text(events[events["kind"] == "kernel"]["name"]))
    verdicts = {name: uses_tensor_cores(name) for name in names}
    assert must_have <= set(verdicts.values())
    # The fp32 V100 ResNet run never touched a tensor core; the bf16 H100 run's GEMMs did.
    if "v100" in trace:
        assert True not in verdicts.values()
    gemms = [n for n in names if "gemm" in n.lower() and "reduce" not in n.lower()]
    assert all(verdicts[n] is not None for n in gemms), [n for n in gemms if verdicts[n] is None]


# -- wave quantisation --------------------------------------------------------------------------------


def test_wave_quantization_as_in_nvidias_guide():
    # 108 SMs, 256x128 tiles, one per SM: 108 tiles fill one wave; 109 need a second, nearly empty.
    full = wave_quantization(256 * 108, 128, sm_count=108, tile=(256, 128))
    assert (full.tiles, full.waves, full.wave_efficiency) == (108, 1, 1.0)
    over = wave_quantization(256 * 109, 128, sm_count=108, tile=(256, 128))
    assert (over.tiles, over.waves) == (109, 2)
    assert over.wave_efficiency == pytest.approx(109 / 216)
    padded = wave_quantization(257, 128, sm_count=108, tile=(256, 128))
    assert padded.tiles == 2 and padded.tile_efficiency == pytest.approx(257 / 512)
    batched = wave_quantization(128, 128, sm_count=132, batch=264)
    assert (batched.tiles, batched.waves, batched.efficiency) == (264, 2, 1.0)
    with pytest.raises(ValueError):
        wave_quantization(0, 128, sm_count=108)


def test_the_knowledge_base_is_loaded_once_and_the_public_names_exist():
    assert kb.knowledge() is kb.knowledge()
    assert all(hasattr(kb, name) for name in kb.__all__)


def test_a_gemm_kernel_s_name_gives_its_output_tile():
    assert kb.kernel_tile("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x112x64_MI16x16x1_SN") == (256, 112)
    assert kb.kernel_tile("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1") == (128, 128)
    assert kb.kernel_tile("ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_32x3_nn") == (256, 128)
    assert kb.kernel_tile("void at::native::vectorized_elementwise_kernel<4>") is None


def test_the_amd_architectures_need_sixteen_byte_multiples_and_cdna2_has_no_fp8_or_tf32():
    for arch in ("cdna2", "cdna3", "cdna4"):
        assert tensor_core_rule(arch, "bf16").required_multiple == 8
        assert tensor_core_rule(arch, "int8").required_multiple == 16
    assert tensor_core_rule("cdna3", "fp8").required_multiple == 16
    assert tensor_core_rule("cdna3", "tf32").required_multiple == 4
    assert tensor_core_rule("cdna2", "fp8") is None and tensor_core_rule("cdna2", "tf32") is None
    assert tensor_core_rule("cdna4", "tf32") is None
    assert tensor_core_rule(gpu_profile("mi300x"), "bf16").architecture == "cdna3"
