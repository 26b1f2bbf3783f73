"""The shipped `shapes` base: it loads as a preset and is checked against its manifest, and the
command that rebuilds it still runs end to end and improves both parts at a short budget."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from cosmos_rl.algorithms.sft import flow_matching_loss, reconstruction_loss
from cosmos_rl.data.captions import CaptionShards
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.flow import noisy_latents
from cosmos_rl.models.build import build_preset, load_parts
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.models.packing import velocity
from cosmos_rl.models.text import model_prompt_ids
from cosmos_rl.models.vae import encode_images
from cosmos_rl.commands import base_build
from cosmos_rl.models.shapes_preset import WEIGHTS_DIR, load_shapes_base, read_manifest


def test_the_shipped_base_is_a_preset_with_the_minimal_template():
    parts = build_preset("shapes", seed=123)
    assert parts.prompt_template == "minimal"
    assert parts.transformer.config.hidden_size == 128 and parts.transformer.config.rope_theta == 100.0
    manifest = read_manifest()
    assert all(info["bytes"] < 4 * 2**20 for info in manifest["files"].values())
    assert manifest["latents_std"] == list(parts.vae.config.latents_std)
    assert "shapes_base build" in manifest["command"]
    held = manifest["held_out"]
    assert all(0.0 <= scores["strict"] <= scores["partial"] <= 1.0 for scores in held.values())


def test_a_changed_weight_file_is_refused(tmp_path):
    shutil.copytree(WEIGHTS_DIR, tmp_path / "shapes")
    path = tmp_path / "shapes" / "vae.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="sha256 differs from manifest.json"):
        load_shapes_base(tmp_path / "shapes")


def _fixed_flow_loss(transformer, vae, tokenizer, images, captions) -> float:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        x0 = encode_images(vae, images)
        eps = torch.randn(x0.shape, generator=generator)
        t = torch.rand(x0.shape[0], generator=generator)
        ids, _ = model_prompt_ids(tokenizer, "minimal", captions, MediaSpec.image(32))
        return float(flow_matching_loss(velocity(transformer, noisy_latents(x0, eps, t), t, ids), x0, eps))


def _reconstruction(vae, images) -> float:
    with torch.no_grad():
        video = (images * 2 - 1).unsqueeze(2)
        return float(reconstruction_loss(vae.decode(vae.encode(video).latent_dist.mode()).sample, video))


def test_the_rebuild_command_runs_and_improves_the_model(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        code = base_build.main([
            "build", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--samples", "48",
            "--vae-steps", "30", "--vae-batch", "8", "--steps", "30", "--batch", "8", "--checkpoint-every", "15",
            "--eval-seeds", "0",
        ])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    # Into a log (captured, no terminal): each stage's progress lines, then the closing summary.
    printed = capsys.readouterr()
    steps = [line.split(" (")[0] for line in printed.out.splitlines() if line.startswith("step ") and "%)" in line]
    # the VAE stage, then the transformer's: a line every 10 steps (job.log_every; a slow machine may add timed ones)
    assert [s for s in steps if s in ("step 10/30", "step 20/30", "step 30/30")] == ["step 10/30", "step 20/30", "step 30/30"] * 2
    summary = printed.err.splitlines()
    assert summary[0].startswith("done: built shapes in ") and summary[0].endswith(f"; weights and manifest.json in {tmp_path / 'out'}")
    assert "(stages: vae 0:" in summary[0] and summary[-1].startswith("  next: cosmos-rl eval preset:shapes")
    built = load_shapes_base(tmp_path / "out")  # the float16 files, checked against the manifest
    init = load_parts(tmp_path / "work" / "init")
    source = CaptionShards(sorted(str(p) for p in (tmp_path / "work" / "shards").glob("*.tar")), MediaSpec.image(32))
    images = torch.stack([source[i].image for i in range(16)])
    captions = [source.caption(i) for i in range(16)]
    assert _reconstruction(built.vae, images) < 0.5 * _reconstruction(init.vae, images)
    before = _fixed_flow_loss(init.transformer, built.vae, built.tokenizer, images, captions)
    after = _fixed_flow_loss(built.transformer, built.vae, built.tokenizer, images, captions)
    assert after < 0.9 * before
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["recipe"]["steps"] == 30 and set(manifest["wall_clock_s"]) == {"vae", "transformer"}
    # Asking for fewer steps than a stage has trained is refused, not silently ignored.
    assert base_build.main(["build", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
                            "--samples", "48", "--vae-steps", "10", "--eval-seeds", "0"]) == 2


def test_score_images_is_one_for_ground_truth_and_counts_tasks_equally():
    import numpy as np

    from cosmos_rl.models.shapes_held_out import score_images
    from cosmos_rl.shapes import parse_caption, render

    prompts = ["a circle", "two red squares", "a blue triangle above a circle"]
    truth = np.stack([render(parse_caption(p), 7, 32) for p in prompts])
    scores = score_images(truth, prompts)
    assert scores["strict"] == scores["partial"] == 1.0 and scores["images"] == 3
    mixed = truth.copy()
    mixed[2] = 0  # the position image left black: 0 of its 3 constraints, task mean 0
    scores = score_images(mixed, prompts)
    assert scores["strict_by_task"] == {"single_object": 1.0, "counting": 1.0, "position": 0.0}
    assert scores["strict"] == round(2 / 3, 4)  # unweighted over the three tasks present, rounded to 4 places
