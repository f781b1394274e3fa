"""The example scripts with planted problems, and the benchmarks that go with them.

- Each new example runs plainly on a CPU and exits 0 (each in a subprocess of its own, one
  at a time, when a test first asks for it: started together they fought over the cores and
  a fixed timeout failed them all on a busy machine).
- The scripts written as users write them (tokenize_dataset, char_features, in_memory_loop,
  augment_loop, spawn_train, custom_collate, anomaly_left_on, loss_loop, masked_pooling, copied_threads, hand_written_update) also run their fixes and print the step time they measured themselves.
- odd_gemm's GEMM sizes miss multiples of 8 and aligned_gemm's are the same sizes
  rounded up to them, read from the models the scripts build.
- benchmarks/collector_overhead.py runs its CPU rows and says the GPU rows need a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

# End-to-end: scripts, processes or servers started; `pytest -m 'not slow'` leaves them out.
pytestmark = pytest.mark.slow


torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
BENCHMARKS = REPO / "benchmarks"


def load_module(path: Path) -> ModuleType:
    """A script as a module, without running its main()."""
    spec = importlib.util.spec_from_file_location(f"_under_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


# -- the examples run ------------------------------------------------------------------------------

RUNS = {
    "pageable_copies": ["pageable_copies.py", "--steps", "2", "--batch-size", "8"],
    "odd_gemm": ["odd_gemm.py", "--steps", "2"],
    "aligned_gemm": ["aligned_gemm.py", "--steps", "2"],
    "small_batch": ["small_batch.py", "--steps", "2"],
    "per_parameter_optimizer": ["per_parameter_optimizer.py", "--steps", "2"],
    "host_made_tensors": ["host_made_tensors.py", "--steps", "2"],
    "conv_bias_bn": ["conv_bias_bn.py", "--steps", "2"],
    "allreduce_after_backward": ["allreduce_after_backward.py", "--steps", "2"],
    # scripts as users write them; three steps, so each times one step after its two warm-up steps
    "tokenize_dataset": ["tokenize_dataset.py", "--steps", "3", "--num-workers", "1"],
    "char_features": ["char_features.py", "--steps", "3"],
    "char_features_fixed": ["char_features.py", "--steps", "3", "--num-workers", "2", "--torch-threads", "1"],
    "char_features_precomputed": ["char_features.py", "--steps", "3", "--precompute"],
    "in_memory_loop": ["in_memory_loop.py", "--steps", "3"],
    "in_memory_loop_batched": ["in_memory_loop.py", "--steps", "3", "--batched"],
    "augment_loop": ["augment_loop.py", "--steps", "3"],
    "augment_loop_vectorized": ["augment_loop.py", "--steps", "3", "--vectorized"],
    "loss_loop": ["loss_loop.py", "--steps", "3"],
    "loss_loop_vectorized": ["loss_loop.py", "--steps", "3", "--vectorized"],
    "masked_pooling": ["masked_pooling.py", "--steps", "3"],
    "masked_pooling_batched": ["masked_pooling.py", "--steps", "3", "--batched"],
    "hand_written_update": ["hand_written_update.py", "--steps", "3"],
    "hand_written_update_optimizer": ["hand_written_update.py", "--steps", "3", "--optimizer"],
    "copied_threads": ["copied_threads.py", "--steps", "3", "--batch-size", "32"],
    "copied_threads_cores": ["copied_threads.py", "--steps", "3", "--batch-size", "32", "--threads", "cores"],
    "spawn_train_gloo": ["spawn_train.py", "--steps", "3", "--gloo"],
    "custom_collate": ["custom_collate.py", "--steps", "3"],
    "custom_collate_workers": ["custom_collate.py", "--steps", "3", "--num-workers", "2", "--torch-threads", "1"],
    "custom_collate_precomputed": ["custom_collate.py", "--steps", "3", "--precompute"],
    "json_records": ["json_records.py", "--steps", "3", "--records", "256"],
    "json_records_precomputed": ["json_records.py", "--steps", "3", "--records", "256", "--precompute"],
    "random_augment": ["random_augment.py", "--steps", "3", "--images", "128"],
    "random_augment_workers": ["random_augment.py", "--steps", "3", "--images", "128", "--num-workers", "1",
                               "--torch-threads", "1"],
    "decode_and_flip": ["decode_and_flip.py", "--steps", "3", "--images", "96"],
    "decode_and_flip_precomputed": ["decode_and_flip.py", "--steps", "3", "--images", "96", "--precompute"],
    "anomaly_left_on": ["anomaly_left_on.py", "--steps", "3"],
    "anomaly_left_on_fixed": ["anomaly_left_on.py", "--steps", "3", "--no-anomaly"],
}
USERS_SCRIPTS = ["tokenize_dataset.py", "char_features.py", "in_memory_loop.py", "augment_loop.py", "spawn_train.py",
                 "custom_collate.py", "anomaly_left_on.py", "loss_loop.py", "json_records.py", "random_augment.py",
                 "decode_and_flip.py", "masked_pooling.py", "copied_threads.py",
                 "hand_written_update.py"]


OVERHEAD = "collector_overhead"
# Only against a run that hangs: a script here takes seconds, and a slow machine must never
# be what fails it.
HANG_GUARD_S = 1800


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """``example_runs(name)``: the run ``name`` (an example of RUNS, or OVERHEAD: the
    collector-overhead benchmark's CPU rows), started the first time a test asks for it and
    kept for the others. One at a time: each is a Python process that mostly imports torch,
    so side by side on a small machine they only slow each other down."""
    overhead_json = tmp_path_factory.mktemp("overhead") / "overhead.json"
    done: dict[str, subprocess.CompletedProcess] = {}

    def run(name: str) -> subprocess.CompletedProcess:
        if name not in done:
            if name == OVERHEAD:
                command = [sys.executable, str(BENCHMARKS / "collector_overhead.py"), "--part", "loop", "--window",
                           "1:3", "--batch-size", "8", "--device", "cpu", "--json", str(overhead_json)]
            else:
                command = [sys.executable, str(EXAMPLES / RUNS[name][0]), *RUNS[name][1:], "--device", "cpu"]
            done[name] = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=HANG_GUARD_S)
        return done[name]

    return run


@pytest.mark.parametrize("name", list(RUNS))
def test_example_runs_on_cpu(example_runs, name):
    done = example_runs(name)
    assert done.returncode == 0, done.stderr[-2000:]
    script = RUNS[name][0].removesuffix(".py")
    steps = RUNS[name][RUNS[name].index("--steps") + 1]
    assert done.stdout.startswith(f"{script}: {steps} steps"), done.stdout
    if RUNS[name][0] in USERS_SCRIPTS:  # they time their own steps after two warm-up steps
        assert re.search(r" \d+\.\d+ ms/step", done.stdout), done.stdout


@pytest.mark.parametrize("script", ["pageable_copies.py", "odd_gemm.py", "aligned_gemm.py", "small_batch.py",
                                    "per_parameter_optimizer.py", "host_made_tensors.py", "conv_bias_bn.py",
                                    "allreduce_after_backward.py",
                                    *USERS_SCRIPTS])
def test_example_says_what_is_planted_and_takes_the_common_options(script):
    module = load_module(EXAMPLES / script)
    doc = module.__doc__ or ""
    assert "planted" in doc.lower() or "twin" in doc.lower()
    assert "fix" in doc.lower()
    source = (EXAMPLES / script).read_text()
    for option in ('"--steps"', '"--device"', '"--seed"'):
        assert option in source, f"{script} lacks {option}"
    assert callable(module.build_model)


# -- the GEMM twins ----------------------------------------------------------------------------------


def linear_sizes(module: ModuleType) -> list[tuple[int, int]]:
    model = module.build_model()
    return [(layer.in_features, layer.out_features) for layer in model.modules() if isinstance(layer, torch.nn.Linear)]


def round_up(value: int, multiple: int = 8) -> int:
    return -(-value // multiple) * multiple


def test_odd_gemm_misses_multiples_of_eight_in_every_layer():
    odd = load_module(EXAMPLES / "odd_gemm.py")
    sizes = linear_sizes(odd)
    assert len(sizes) == 3
    for fan_in, fan_out in sizes:
        assert fan_in % 8 or fan_out % 8, (fan_in, fan_out)
    assert odd.BATCH_SIZE % 8  # M, the batch, misses too


def test_aligned_gemm_is_odd_gemm_rounded_up_to_multiples_of_eight():
    odd = load_module(EXAMPLES / "odd_gemm.py")
    aligned = load_module(EXAMPLES / "aligned_gemm.py")
    sizes = linear_sizes(aligned)
    assert all(fan_in % 8 == 0 and fan_out % 8 == 0 for fan_in, fan_out in sizes), sizes
    assert aligned.BATCH_SIZE % 8 == 0
    assert sizes == [(round_up(a), round_up(b)) for a, b in linear_sizes(odd)]
    assert aligned.BATCH_SIZE == round_up(odd.BATCH_SIZE)


def test_small_batch_defaults_to_a_tiny_batch():
    source = (EXAMPLES / "small_batch.py").read_text()
    assert '"--batch-size", type=int, default=4' in source
    module = load_module(EXAMPLES / "small_batch.py")
    launches = sum(1 for m in module.build_model().modules() if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)))
    assert launches >= 20  # many small layers: many small kernels a step


# -- collector_overhead ---------------------------------------------------------------------------------------


def test_collector_overhead_runs_its_cpu_rows(example_runs):
    done = example_runs(OVERHEAD)
    assert done.returncode == 0, done.stderr[-2000:]
    written = Path(done.args[done.args.index("--json") + 1])
    rows = {row["name"]: row for row in json.loads(written.read_text())["loop"]["rows"]}
    assert set(rows) == {"plain", "host", "torch.profiler", "cupti"}
    for name in ("plain", "host"):
        assert len(rows[name]["step_s"]) == 2 and rows[name]["median_s"] > 0 and not rows[name]["failed"]
    assert rows["host"]["after_s"]  # advisor's rows say what the work after the run cost
    for name in ("torch.profiler", "cupti"):
        assert rows[name]["step_s"] == [] and "needs a CUDA GPU" in rows[name]["note"]
    assert "x plain" in done.stdout and "needs a CUDA GPU" in done.stdout


def test_collector_overhead_window_is_checked():
    import argparse

    from advisor.doctor.loop import parse_window

    assert parse_window("3:23") == (3, 23)
    for bad in ("0:5", "5:5", "5", "a:b"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_window(bad)


# -- loss_loop's fix computes the loss the loop does -------------------------------------------------


def test_the_vectorised_loss_is_the_looped_one_with_the_same_gradients():
    loss_loop = load_module(EXAMPLES / "loss_loop.py")
    logits = torch.randn(16, loss_loop.CLASSES, requires_grad=True)
    target = torch.randint(0, loss_loop.CLASSES, (16,))
    looped = loss_loop.smoothed_loss(logits, target)
    (looped_grad,) = torch.autograd.grad(looped, logits)
    batched = loss_loop.smoothed_loss_batch(logits, target)
    (batched_grad,) = torch.autograd.grad(batched, logits)
    assert torch.allclose(looped, batched, atol=1e-6) and torch.allclose(looped_grad, batched_grad, atol=1e-6)


def test_masked_pooling_batched_is_the_row_loop_with_the_same_gradients():
    example = load_module(EXAMPLES / "masked_pooling.py")
    torch.manual_seed(0)
    looped, batched = example.Pooled(batched=False), example.Pooled(batched=True)
    batched.load_state_dict(looped.state_dict())
    tokens = torch.randn(16, example.TOKENS, example.FEATURES)
    lengths = torch.randint(1, example.TOKENS + 1, (16,))
    out_looped, out_batched = looped(tokens, lengths), batched(tokens, lengths)
    assert torch.allclose(out_looped, out_batched, atol=1e-5)
    grads = [torch.autograd.grad(out.square().sum(), model.encoder[0].weight)[0]
             for out, model in ((out_looped, looped), (out_batched, batched))]
    assert torch.allclose(grads[0], grads[1], atol=1e-4)


# -- the loaders' items made once are the items made when asked for ---------------------------------


def test_char_features_made_once_are_the_features_made_per_item():
    char_features = load_module(EXAMPLES / "char_features.py")
    asked, once = char_features.CharFeatures(8, seed=3), char_features.CharFeatures(8, seed=3, precompute=True)
    for i in range(8):
        assert torch.equal(asked[i][0], once[i][0]) and asked[i][1] == once[i][1]


def test_json_records_decoded_once_are_the_records_decoded_per_item():
    json_records = load_module(EXAMPLES / "json_records.py")
    asked, once = json_records.Records(8, seed=3), json_records.Records(8, seed=3, precompute=True)
    for i in range(8):
        assert torch.equal(asked[i][0], once[i][0]) and asked[i][1] == once[i][1]


def test_random_augment_s_items_differ_each_time_they_are_asked_for():
    # the planted property: the items cannot be made once before training
    random_augment = load_module(EXAMPLES / "random_augment.py")
    data = random_augment.Augmented(4, seed=3)
    first, again = data[2], data[2]
    assert first[0].shape == (3, random_augment.SIZE, random_augment.SIZE) and first[1] == again[1]
    assert not torch.equal(first[0], again[0])


def test_decode_and_flip_s_images_decoded_once_are_the_images_decoded_per_item():
    decode_and_flip = load_module(EXAMPLES / "decode_and_flip.py")
    asked, once = decode_and_flip.EncodedImages(4, seed=3), decode_and_flip.EncodedImages(4, seed=3, precompute=True)
    for i in range(4):
        assert torch.equal(torch.from_numpy(asked.decode(asked.blobs[i])), torch.from_numpy(once.decoded[i]))
        # the flip is drawn for every item: the item is the decoded image, flipped or not
        image, label = once[i]
        assert label == asked.labels[i] and image.shape == (3, decode_and_flip.SIZE, decode_and_flip.SIZE)


def test_custom_collate_s_precomputed_counts_make_the_same_batch():
    custom_collate = load_module(EXAMPLES / "custom_collate.py")
    asked, once = custom_collate.Sequences(8, seed=3), custom_collate.Sequences(8, seed=3, precompute=True)
    batch = custom_collate.pad_and_count([asked[i] for i in (5, 1, 7)])
    made = custom_collate.pad_and_stack([once[i] for i in (5, 1, 7)])
    assert all(torch.equal(a, b) for a, b in zip(batch, made, strict=True))


# -- augment_loop's fix does what the per-sample augmentation does ------------------------------------


def test_augment_batch_crops_flips_and_normalises_like_augment():
    augment_loop = load_module(EXAMPLES / "augment_loop.py")
    images = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    mean, std = augment_loop.MEAN, augment_loop.STD

    def choices(n):  # every image augment() could make of image n
        return [(view.flip(-1) if flipped else view).sub(mean).div(std)
                for top in range(9) for left in range(9) for flipped in (False, True)
                for view in [padded[n, :, top:top + 32, left:left + 32]]]

    generator = torch.Generator().manual_seed(1)
    batch = augment_loop.augment_batch(images, generator)
    single = [augment_loop.augment(images[n], generator) for n in range(len(images))]
    assert batch.shape == images.shape
    for n in range(len(images)):
        assert any(torch.allclose(batch[n], choice) for choice in choices(n)), n
        assert any(torch.allclose(single[n], choice) for choice in choices(n)), n
