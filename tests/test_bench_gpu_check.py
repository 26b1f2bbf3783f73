"""bench/gpu_check.py at tiny size on CPU, so the GPU script cannot rot between GPU slots."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A subprocess that forms a (one-rank) gloo world.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.py"


def _run(*args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "tiny", "--device", "cpu", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)  # the whole of stdout is one JSON object


def _bench_module(name: str):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_tiny_cpu_run_reports_every_figure(tmp_path):
    """The --model path: a diffusers folder's architecture and tokenizer, random weights; in bfloat16,
    the GPU run's default (mixed precision runs on the CPU too, slowly)."""
    from cosmos_rl.models.build import build_preset, save_parts

    folder = save_parts(build_preset("tiny", seed=0), tmp_path / "model")
    image_phases = "nft_policy_only,rollout,nft,dpo,generation_targets"  # the video phase has a test of its own
    out = _run("--model", str(folder), "--iters", "1", "--repeats", "1", "--dtype", "bfloat16", "--phases", image_phases)
    assert out["device"] == "cpu" and out["fsdp2"] is True and out["peak_bf16_tflops"] is None
    assert out["video"] == {"skipped": "not asked for (--phases)"}
    assert out["dtype"] == "bfloat16"
    # The pipeline's integer timesteps and float32 positions reach the forward; the layers compute in
    # bf16; gradients, AdamW moments and master weights stay float32 (docs/scale.md, "Precision").
    assert out["dtypes"] == {
        "timesteps": "torch.int64", "positions": "torch.float32", "layer_weights": "torch.bfloat16",
        "reduced_grads": ["torch.float32"], "optimizer_state": ["torch.float32"], "master_weights": ["torch.float32"],
    }  # fmt: skip
    assert out["model"] == str(folder)
    config = out["model_config"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vision_tokens_per_image"]) == (64, 2, 16)
    assert config["params_per_token"] == 90112  # worked by hand in tests/test_bench_mfu.py
    assert config["text_tokens_mean"] > 100  # the folder's byte-level tokenizer, system prompt included

    rollout = out["rollout"]
    assert rollout["samples"] == 4 and rollout["packed_s"] > 0 and rollout["pipeline_s"] > 0
    assert rollout["speedup"] == pytest.approx(rollout["pipeline_s"] / rollout["packed_s"], rel=0.01)
    assert rollout["packed_mfu"] is None and rollout["transformer_flops"] > 0

    only, nft, dpo = out["nft_policy_only"], out["nft"], out["dpo"]
    assert (only["no_grad_forwards"], nft["no_grad_forwards"], dpo["no_grad_forwards"]) == (0, 2, 1)
    # Same batch: policy-only is one forward+backward (3 forwards), the full step adds old and reference (5).
    assert nft["flops"] * 3 == only["flops"] * 5
    for phase in (only, nft, dpo):
        assert phase["step_s"] > 0 and phase["mfu"] is None and phase["peak_memory_mib"] > 100

    # the default targets adapt the text tower (no reuse); the generation-only phase reuses it
    assert (rollout["targets"], rollout["text_tower_reuse"], nft["text_tower_reuse"]) == ("default (both towers)", False, False)
    towers = out["generation_targets"]
    assert towers["targets"] == ["generation"] and towers["text_tower_reuse"] is True
    assert 0 < towers["trainable_params"] < towers["default_targets_trainable_params"] == rollout["trainable_params"]
    assert towers["rollout_reuse_speedup"] == pytest.approx(towers["rollout_without_reuse_s"] / towers["rollout_with_reuse_s"], rel=0.01)
    assert towers["nft_train_with_reuse_s"] > 0 and towers["nft_train_without_reuse_s"] > 0

    assert out["memory"]["kind"] == "cpu_peak_rss" and out["memory"]["ratio"] is None
    assert out["memory"]["peak_mib"] >= nft["peak_memory_mib"]


def test_phases_runs_only_the_phases_asked_for():
    """A short GPU slot measures the tower targets first: `--phases generation_targets` builds no
    default-targets model and says so for every phase it left out."""
    out = _run("--iters", "1", "--repeats", "1", "--phases", "generation_targets", "--rollout-samples", "2")
    assert "model_config" not in out and "memory" not in out
    assert out["generation_targets"]["rollout_samples"] == 2
    assert out["generation_targets"]["text_tower_reuse"] is True
    assert out["generation_targets"]["default_targets_trainable_params"] is None  # its model was not built
    assert out["generation_targets"]["rollout_with_reuse_s"] > 0

    out = _run("--iters", "1", "--repeats", "1", "--phases", "dpo,rollout")
    assert out["nft_policy_only"] == out["nft"] == out["generation_targets"] == out["video"] == {"skipped": "not asked for (--phases)"}
    assert out["rollout"]["samples"] == 4 and out["dpo"]["no_grad_forwards"] == 1
    assert out["memory"]["ratio"] is None


def test_video_phase_at_tiny_size_reports_every_figure(tmp_path):
    """`--phases video` on CPU: 5-frame 32x48 clips through a VAE that halves time, the packed
    rollout against the stock pipeline (same clips), a profile of a rollout step, NFT and GRPO steps."""
    trace = tmp_path / "rollout_step.json"
    out = _run("--phases", "video", "--iters", "1", "--repeats", "1", "--trace", str(trace))
    assert "model_config" not in out and out["rollout"] == {"skipped": "not asked for (--phases)"}
    video = out["video"]
    assert video["media"] == {"frames": 5, "height": 32, "width": 48, "fps": 16.0}
    # 5 frames -> frame 0 alone + 4 frames halved = 3 latent frames of 32/4 x 48/4 cells; 2x2 patches
    assert video["latent_shape"] == [4, 3, 8, 12] and video["vision_tokens_per_clip"] == 3 * 4 * 6
    assert video["targets"] == ["generation"] and video["text_tower_reuse"] is True

    rollout = video["rollout"]
    assert rollout["samples"] == 2 and rollout["packed_s"] > 0 and rollout["pipeline_s"] > 0
    assert rollout["speedup"] == pytest.approx(rollout["pipeline_s"] / rollout["packed_s"], rel=0.01)
    assert rollout["packed_samples_per_s"] == pytest.approx(2 / rollout["packed_s"], rel=0.01)
    # The same clips either way: the packed sampler follows the pipeline step for step (float32).
    assert rollout["clips_shape"] == rollout["pipeline_clips_shape"] == [2, 5, 3, 32, 48]
    assert rollout["max_abs_pixel_diff"] <= 1e-5
    # guidance 1: one packed forward per sampler step; the first step runs the text tower for the
    # prompt the warm-up did not hold, every later step reads its keys/values, which the stock
    # pipeline never does, so the packed rollout needs fewer FLOPs for the same clips
    assert rollout["packed_forwards"] == video["sample_steps"] == 3 and rollout["packed_text_reused_forwards"] == 2
    assert 0 < rollout["packed_flops"] < rollout["pipeline_flops"]
    assert rollout["packed_mfu"] is None and rollout["pipeline_mfu"] is None  # no peak on CPU
    assert rollout["packed_peak_memory_mib"] > 100 and rollout["pipeline_peak_memory_mib"] > 100  # peak RSS

    profile = video["profile"]
    assert set(profile["families_s"]) == {
        "matmul", "attention", "norm", "elementwise", "cast_copy", "communication", "other", "framework"
    }  # fmt: skip
    assert profile["total_s"] > 0 and all(v >= 0 for v in profile["families_s"].values())
    assert sum(profile["families_s"].values()) <= profile["total_s"]
    assert profile["families_s"]["matmul"] > 0 and profile["families_s"]["attention"] > 0
    assert profile["launch_kind"] == "aten_ops" and profile["time_kind"] == "self_cpu"
    assert profile["layer_forwards"] == profile["decoder_layers"] == 2
    assert 0 < profile["per_layer_launches"] * 2 < profile["launches"]
    assert profile["text_tower_reuse"] is True and profile["samples"] == 2
    assert profile["trace"] == str(trace) and json.loads(trace.read_text())["traceEvents"]

    nft, grpo = video["nft"], video["grpo"]
    # NFT as the T2V manifest: no KL, so the old forward and the policy forward+backward of 2 rows x 2 timesteps
    assert (nft["forwards"], nft["grad_forwards"], nft["samples_per_forward"], nft["kl_beta"]) == (2, 1, 4, 0.0)
    # GRPO-Fast: a 2-step window, each trained step a reference and a policy forward of the 2 clips
    assert (grpo["trained_steps"], grpo["forwards"], grpo["grad_forwards"], grpo["samples_per_forward"]) == (2, 4, 2, 2)
    for step in (nft, grpo):
        assert step["step_s"] > 0 and step["flops"] > 0 and step["mfu"] is None and step["peak_memory_mib"] > 100
    assert grpo["sde_rollout_s"] > 0


def test_an_unknown_phase_is_refused_by_name(capsys):
    """The script's own argument parsing (its main() parses sys.argv the same way), in this process:
    a fresh interpreter would import torch and the stack first just to be refused."""
    gpu_check = _bench_module("gpu_check")
    with pytest.raises(SystemExit) as stopped:
        gpu_check.parse_args(["--size", "tiny", "--device", "cpu", "--phases", "rollout,rollouts"])
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and "unknown phase(s) ['rollouts']" in err and not out


def test_a_spent_budget_skips_the_phase_without_running_it():
    import torch

    gpu_check = _bench_module("gpu_check")
    clock = gpu_check.Clock(budget_s=-1.0)

    def must_not_run():
        raise AssertionError("a phase ran after the budget was spent")

    skipped = gpu_check.step_phase(clock, torch.device("cpu"), 3, must_not_run, None, [], None)
    assert "time budget spent" in skipped["skipped"]
    assert "time budget spent" in gpu_check.rollout_phase(None, None, None, None, clock, 1, None, None)["skipped"]
    assert "time budget spent" in gpu_check.video_phase(None, None, clock, None)["skipped"]
    assert "time budget spent" in gpu_check.video_rollout_phase(None, None, None, None, clock, 1, None, None)["skipped"]
    assert "time budget spent" in gpu_check.video_step_phase(clock, None, 1, must_not_run, None, None)["skipped"]
    memory = gpu_check._memory({"nft_policy_only": skipped, "nft": skipped}, torch.device("cpu"))
    assert memory["ratio"] is None and memory["kind"] == "cpu_peak_rss"


def test_nano_like_configuration_is_consistent():
    """The GPU run's assumed Nano-like layout builds (on the meta device: no memory) and obeys the
    layout rules: patch_latent_dim = channels * patch^2, channels = VAE z_dim, RoPE axes = head_dim / 2."""
    import torch
    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    steps = _bench_module("cosmos3_steps")
    t, v = steps.NANO_TRANSFORMER, steps.NANO_VAE
    assert t["patch_latent_dim"] == t["latent_channel"] * t["latent_patch_size"] ** 2
    assert t["latent_channel"] == v["z_dim"] == len(v["latents_mean"]) == len(v["latents_std"])
    assert sum(t["rope_axes_dim"]) == t["head_dim"] // 2
    with torch.device("meta"):
        transformer = Cosmos3OmniTransformer(**t, dtype="float32")
        AutoencoderKLWan(**v)
    total = sum(p.numel() for p in transformer.parameters())
    assert 15.0e9 < total < 15.3e9  # the size the docs and the module docstring state
    image = steps.SIZES["nano"].image
    assert image % v["scale_factor_spatial"] == 0 and (image // v["scale_factor_spatial"]) % t["latent_patch_size"] == 0
    # The video phase's clips: 832x480 over 16x cells, 17 frames = frame 0 + 16 at 4x in time
    from cosmos_rl.core.media import latent_shape

    clip = steps.VIDEO_SIZES["nano"]
    assert (clip.width, clip.height, clip.frames) == (832, 480, 17)
    assert latent_shape(clip.media, v, t) == (48, 5, 30, 52)  # 5 x 15 x 26 = 1950 vision tokens at 2x2 patches


def test_profile_families_by_op_name_and_kernels_by_their_op():
    """The profile's families: by the op's name; a CUDA runtime call's kernels belong to the op that
    launched it (the profiler may hang them on either)."""
    from types import SimpleNamespace

    gpu_check = _bench_module("gpu_check")
    names = ["aten::addmm", "aten::_flash_attention_forward", "aten::add_", "aten::expand", "aten::_to_copy",
             "aten::rms_norm", "nccl:_all_gather_base", "FSDP::pre_forward"]  # fmt: skip
    assert [gpu_check.op_family(n) for n in names] == [
        "matmul", "attention", "elementwise", "other", "cast_copy", "norm", "communication", "framework"
    ]  # fmt: skip
    mm = SimpleNamespace(name="aten::mm", cpu_parent=None)
    launch = SimpleNamespace(name="cudaLaunchKernel", cpu_parent=mm)
    assert gpu_check._family_of_event(launch) == "matmul"
    assert gpu_check._family_of_event(SimpleNamespace(name="cudaMemcpyAsync", cpu_parent=None)) == "framework"
