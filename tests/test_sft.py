"""SFT: the losses against hand values, the minimal prompt template, image-caption sources, and the
trainer in one process (both modes learn, an in-process resume matches a straight run), plus one
`cosmos-rl train` through torchrun."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cosmos_rl.algorithms.sft import (
    class_weights,
    flow_matching_loss, foreground_mask, psnr_db, reconstruction_loss, weighted_reconstruction_loss,
)
from cosmos_rl.config import load
from cosmos_rl.data.captions import CaptionJsonl, CaptionShards
from cosmos_rl.core.errors import UserError
from cosmos_rl.models.build import build_preset, load_parts, save_parts
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.models.text import model_prompt_ids, tokenize_prompts
from cosmos_rl.shapes import Group, Spec, render, write_shards
from cosmos_rl.trainers.sft import SFTTrainer

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parent.parent
SPECS = [Spec((Group("circle", "red"),)), Spec((Group("square", "blue", 2),)), Spec((Group("triangle"),))]


# ------------------------------------------------------------------------------------- math
def test_flow_matching_loss_by_hand():
    x0, eps = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 2.0]])
    assert float(flow_matching_loss(torch.tensor([[1.0, 0.0]]), x0, eps)) == pytest.approx(0.5)
    assert float(flow_matching_loss(torch.tensor([[2.0, 0.0]]), x0, eps)) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        flow_matching_loss(torch.zeros(1, 3), x0, eps)


def test_reconstruction_loss_and_psnr_by_hand():
    assert float(reconstruction_loss(torch.tensor([0.2, -0.2]), torch.tensor([0.0, 0.0]))) == pytest.approx(0.04)
    assert psnr_db(0.04) == pytest.approx(20.0)  # 0.04 on [-1, 1] is 0.01 on [0, 1]
    assert psnr_db(0.0) == math.inf


def test_foreground_weighted_reconstruction_by_hand():
    """One channel, one frame of four pixels [-1, -1, -1, 1]: the median is -1, so only the last
    pixel is foreground. Decoded all -1: squared errors [0, 0, 0, 4]. Weight 9 -> weights
    [1, 1, 1, 9], loss 9 * 4 / 12 = 3; plain MSE 4 / 4 = 1."""
    target = torch.tensor([-1.0, -1.0, -1.0, 1.0]).reshape(1, 1, 1, 2, 2)
    decoded = torch.full_like(target, -1.0)
    assert foreground_mask(target).flatten().tolist() == [False, False, False, True]
    assert float(weighted_reconstruction_loss(decoded, target, 9.0)) == pytest.approx(3.0)
    assert float(weighted_reconstruction_loss(decoded, target, 1.0)) == float(reconstruction_loss(decoded, target)) == 1.0
    # Two channels: a pixel is foreground when any channel is off its median; the weighted mean
    # counts every channel: errors [0, 0, 0, 4] and [0, 0, 0, 0], weights 1, 1, 1, 9 on both
    # channels -> (9 * 4) / (12 * 2) = 1.5.
    two = torch.cat([target, torch.full_like(target, -1.0)], dim=1)
    assert float(weighted_reconstruction_loss(torch.full_like(two, -1.0), two, 9.0)) == pytest.approx(1.5)
    # A pixel within the threshold of the median (0.05 on [-1, 1]) is background.
    faint = torch.tensor([-1.0, -1.0, -1.0, -0.95]).reshape(1, 1, 1, 2, 2)
    assert not foreground_mask(faint).any()


def test_class_weights_by_hand():
    """One frame of 3 x 4 pixels, weights 1 everywhere, the truth's class 1 at (1, 1): grown by one
    pixel it covers columns 0-2 of every row (weight 30); class 2 at (0, 3) keeps weight 1 (not in
    by_class). The decoded frame classes (2, 3) as 1 where the truth has 0: a miss, weight 100; at
    (1, 1) it has 1 as the truth: no miss, 30 stays."""
    truth = torch.zeros(1, 1, 1, 3, 4, dtype=torch.int8)
    truth[..., 1, 1] = 1
    truth[..., 0, 3] = 2
    decoded = truth.clone()
    decoded[..., 2, 3] = 1
    out = class_weights(torch.ones(1, 1, 1, 3, 4), truth, decoded, {1: 30.0}, 100.0)
    assert out[0, 0, 0].tolist() == [[30, 30, 30, 1], [30, 30, 30, 1], [30, 30, 30, 100]]
    # A miss never lowers a weight: a class weight above `miss` stays.
    decoded[..., 0, 0] = 2
    assert class_weights(torch.ones(1, 1, 1, 3, 4), truth, decoded, {1: 300.0}, 100.0)[0, 0, 0, 0].tolist() == [300, 300, 300, 1]
    # Off (no classes, miss 1): the weights come back unchanged, the very tensor.
    base = torch.full((1, 1, 1, 3, 4), 10.0)
    assert class_weights(base, truth, decoded, {}, 1.0) is base


# ----------------------------------------------------------------------------------- prompts
def test_minimal_template_is_the_bytes_then_eos_and_vision_start():
    tokenizer = build_preset("tiny", 0).tokenizer
    cond, uncond = model_prompt_ids(tokenizer, "minimal", ["a circle", "two red squares"], MediaSpec.image(32))
    eos, vision = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert [len(c) for c in cond] == [8 + 2, 15 + 2]
    assert cond[0][-2:].tolist() == [eos, vision] and uncond[0].tolist() == [eos, vision]
    assert tokenizer.decode(cond[0][:-2]) == "a circle"


def test_chat_template_is_the_pipelines_with_the_resolution_sentence():
    tokenizer = build_preset("tiny", 0).tokenizer
    ours = model_prompt_ids(tokenizer, "chat", ["a circle"], MediaSpec.image(32))
    theirs = tokenize_prompts(tokenizer, ["a circle"], resolution=(32, 32))
    assert [t.tolist() for t in ours[0] + ours[1]] == [t.tolist() for t in theirs[0] + theirs[1]]
    assert len(ours[0][0]) > 100  # the system prompt: why small models use `minimal`


def test_the_prompt_template_travels_with_a_saved_model(tmp_path):
    parts = build_preset("tiny", 0)
    assert load_parts(save_parts(parts, tmp_path / "chat")).prompt_template == "chat"
    parts.prompt_template = "minimal"
    assert load_parts(save_parts(parts, tmp_path / "minimal")).prompt_template == "minimal"
    (tmp_path / "minimal" / "cosmos_rl.json").write_text('{"prompt_template": "fancy"}')
    with pytest.raises(UserError, match="names prompt template 'fancy'"):
        load_parts(tmp_path / "minimal")


# ------------------------------------------------------------------------------------- data
def test_caption_shards_read_what_the_shapes_world_writes(tmp_path):
    write_shards(tmp_path, SPECS, seed=5, per_shard=2)
    source = CaptionShards(str(tmp_path / "shapes-{000000..000001}.tar"), MediaSpec.image(32))
    assert len(source) == 3
    sample = source[1]
    assert sample.caption == "two blue squares" and sample.id == "shapes-000000.tar/00000001"
    with tarfile.open(tmp_path / "shapes-000000.tar") as tar:
        seed = json.loads(tar.extractfile("00000001.json").read())["seed"]
    expected = torch.from_numpy(render(SPECS[1], seed, 32)).permute(2, 0, 1).float() / 255
    assert torch.equal(sample.image, expected)


def _png(path: Path) -> None:
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(path)


def test_caption_jsonl_rows_and_errors_name_the_row(tmp_path):
    _png(tmp_path / "a.png")
    good = tmp_path / "good.jsonl"
    good.write_text('{"image": "a.png", "caption": "a circle"}\n\n{"image": "a.png", "prompt": "a square", "id": "x"}\n')
    source = CaptionJsonl(good, MediaSpec.image(32))
    assert [source[0].caption, source[1].caption, source[1].id] == ["a circle", "a square", "x"]
    for text, message in [
        ('{"image": "nope.png", "caption": "c"}', r"bad.jsonl:1: image .*nope.png does not exist"),
        ('{"image": "a.png"}', r"bad.jsonl:1: no 'caption' \(or 'prompt'\) field"),
        ('{"image": "a.png", "caption": "  "}', r"bad.jsonl:1: field 'caption' must be a non-empty string"),
        ("[1]", r"bad.jsonl:1: a row must be a JSON object"),
    ]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text + "\n")
        with pytest.raises(UserError, match=message):
            CaptionJsonl(bad, MediaSpec.image(32))


# ---------------------------------------------------------------------------------- trainer
def make_config(tmp_path: Path, shards: list[str], **rl):
    raw = {
        "job": {"output_dir": str(tmp_path), "name": rl.pop("name", "run"), "progress": False, "seed": 1},
        "model": {"preset": "tiny", "lora": {"rank": 0}},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": {"algorithm": "sft", "max_steps": 4, "samples_per_step": 3, "optimizer": {"lr": 1e-3},
               "data": {"shards": shards}, **rl},
    }
    return load.structure(raw)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sft_shards")
    return [str(p) for p in write_shards(folder, SPECS * 2, seed=0)]


def test_vae_mode_learns_to_reconstruct(tmp_path, shards):
    trainer = SFTTrainer(make_config(tmp_path, shards, train="vae", max_steps=12, samples_per_step=6), tmp_path / "run", CPU)
    rows = [trainer.train_step(step) for step in range(1, 13)]
    assert {"train/loss", "train/psnr", "train/grad_norm", "train/lr", "train/samples_per_s"} <= set(rows[0])
    assert rows[-1]["train/psnr"] > rows[0]["train/psnr"] + 1.0  # the same 6 images every step
    assert not any(p.requires_grad for p in trainer.parts.transformer.parameters())


def test_transformer_mode_resume_matches_a_straight_run(tmp_path, shards):
    straight = SFTTrainer(make_config(tmp_path, shards, name="straight"), tmp_path / "straight", CPU)
    straight.run()
    first = SFTTrainer(make_config(tmp_path, shards, name="split", max_steps=2), tmp_path / "split", CPU)
    first.run()
    resumed = SFTTrainer(make_config(tmp_path, shards, name="split"), tmp_path / "split", CPU, resume=True)
    assert resumed.step == 2 and resumed.cursor.step == 2
    resumed.run()
    for (name, a), b in zip(straight.module.state_dict().items(), resumed.module.state_dict().values()):
        assert torch.equal(a, b), name
    rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(math.isfinite(r["train/loss"]) for r in rows)


def test_caption_dropout_trains_the_empty_prompt(tmp_path, shards):
    trainer = SFTTrainer(make_config(tmp_path, shards, caption_dropout=0.5, samples_per_step=12), tmp_path / "run", CPU)
    assert 0 < trainer.train_step(1)["train/caption_dropped"] < 1
    assert "" in trainer._ids  # the unconditional ids were used


def test_vae_mode_refuses_a_checkpoint_of_another_algorithm(tmp_path, shards):
    SFTTrainer(make_config(tmp_path, shards, max_steps=1), tmp_path / "run", CPU).run()
    meta = tmp_path / "run" / "checkpoints" / "step_1" / "meta.json"
    meta.write_text(meta.read_text().replace('"algorithm": "sft"', '"algorithm": "dpo"'))
    with pytest.raises(UserError, match="written by a dpo run, not sft"):
        SFTTrainer(make_config(tmp_path, shards, max_steps=2), tmp_path / "run", CPU, resume=True)


EVAL = {"every": 2, "per_task": 1, "seeds": 1, "reward": "brightness", "sample_steps": 4}


@pytest.mark.parametrize("train", ["transformer", "vae"])
def test_sft_evaluates_while_training_and_the_eval_command_scores_its_checkpoint_the_same(tmp_path, shards, train):
    """[rl.eval] in both modes: eval/ rows on its steps, training numbers untouched; then `cosmos-rl
    eval RUN_DIR` loads the checkpoint (the VAE, in vae mode) and compares it with the base."""
    from cosmos_rl.commands.evaluate import run_eval

    config = make_config(tmp_path, shards, name="evaluated", train=train, eval=EVAL)
    rows = SFTTrainer(config, tmp_path / "evaluated", CPU).run()
    plain = SFTTrainer(make_config(tmp_path, shards, name="plain", train=train), tmp_path / "plain", CPU).run()
    assert [("eval/score" in r) for r in rows] == [False, True, False, True]
    for evaluated, alone in zip(rows, plain, strict=True):
        assert {k: v for k, v in evaluated.items() if k.startswith("train/") and k != "train/samples_per_s"} == {
            k: v for k, v in alone.items() if k.startswith("train/") and k != "train/samples_per_s"}
    assert rows[1]["eval/score"] != rows[3]["eval/score"]  # the weights moved between the two evaluations
    run_dir = tmp_path / "evaluated"
    (run_dir / "manifest.toml").write_text(load.to_toml(config), encoding="utf-8")
    result = run_eval(str(run_dir), reward="brightness", per_task=1, seeds=1, device="cpu")
    assert result["step"] == 4 and result["sampler"]["steps"] == 4 and result["sampler"]["guidance"] == 3.0
    assert result["score"] == pytest.approx(rows[-1]["eval/score"], abs=1e-3)
    assert result["base_score"] != result["score"]


@pytest.mark.slow
# ("transformer", 1) is the one-rank run of tests/test_dpo_context_parallel.py's sft case, which
# makes the same checks on it: each torchrun launch re-imports the stack in every rank.
@pytest.mark.parametrize("train, ranks", [("vae", 2)])
def test_cosmos_rl_train_runs_sft_under_torchrun(tmp_path, shards, train, ranks):
    overrides = [
        'model.preset="tiny"', f"rl.data.shards={json.dumps(shards)}", "rl.max_steps=2", "rl.samples_per_step=2",
        f'job.output_dir="{tmp_path}"', "job.progress=false", "checkpoint.every=1", f'rl.train="{train}"',
        f"grid.gpus_per_node={ranks}", f"model.config.parallelism.data_parallel_shard_degree={ranks}",
        "job.log_every=1", "rl.eval.every=2", "rl.eval.per_task=1", "rl.eval.seeds=1", 'rl.eval.reward="brightness"',
        "rl.eval.sample_steps=2",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "cosmos_rl.cli", "train", str(ROOT / "manifests" / "sft_shapes_cpu.toml"), *overrides],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "sft_shapes_cpu"
    assert (run_dir / "checkpoints" / "step_2" / "COMMITTED").is_file()
    meta = json.loads((run_dir / "checkpoints" / "step_2" / "meta.json").read_text())
    assert meta["algorithm"] == "sft" and "policy" in meta["components"] and meta["world_size"] == ranks
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "eval/score" in rows[1] and "eval/score" not in rows[0]


def test_plan_of_an_sft_run_launches_the_torchrun_workers():
    from rich.console import Console

    from cosmos_rl.planning import plan
    from cosmos_rl.planning.render import render_plan

    config = load.load(ROOT / "manifests" / "sft_shapes_cpu.toml", ['rl.train="vae"'])
    resolved = plan.build(config, "m.toml")
    assert resolved["per_step"] == {"samples": 64, "samples_per_rank": 64}
    assert resolved["trains"] == "the VAE (autoencoder)" and resolved["checkpoint"]["contents"][0] == "VAE weights"
    assert resolved["launch"][-2:] == ["cosmos_rl.trainers.spmd_worker", "runs/sft_shapes_cpu/manifest.toml"]
    assert resolved["seed_contract"] == {"job.seed": 0, "world_size": 1, "rl.data.shuffle": True}
    assert resolved["eval"]["every"] == 100 and resolved["eval"]["sampler"] == "10 steps, guidance 1"
    assert resolved["eval"]["hacking_window"] == "none (no training reward)"
    on_ray = plan.build(load.load(ROOT / "manifests" / "sft_shapes_cpu.toml", ['grid.backend="ray"']), "m.toml")
    assert on_ray["launch"][:2] == ["cosmos-rl", "train"] and on_ray["ray"]["actors"] == 1
    console = Console(record=True, width=200)
    render_plan(console, resolved)
    assert "the VAE (autoencoder)" in console.export_text()


def test_validate_reads_caption_shards_and_names_the_bad_sample(tmp_path):
    import io

    from cosmos_rl.config.algorithms import check_data

    write_shards(tmp_path, SPECS, seed=0)
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        buffer = io.BytesIO()
        Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(buffer, format="PNG")
        info = tarfile.TarInfo("k1.png")
        info.size = len(buffer.getvalue())
        tar.addfile(info, io.BytesIO(buffer.getvalue()))
    config = load.load(ROOT / "manifests" / "sft_shapes_cpu.toml", [f'rl.data.shards=["{tmp_path}/shapes-000000.tar", "{bad}"]'])
    problems, notes = check_data(config, ROOT)
    assert [p.path for p in problems] == ["rl.data.shards"]
    assert "bad.tar sample 'k1': no caption" in problems[0].problem
    assert "3 good samples, 1 problem(s)" in notes[0]


@pytest.mark.slow
def test_sft_on_ray_actors_matches_torchrun(tmp_path, shards, ray_cluster):
    """The same two 2-rank SFT steps under torchrun and in Ray actors (grid.backend = "ray") give the
    same train/ and eval/ rows exactly (one thread per rank in both)."""
    import io

    from rich.console import Console

    from cosmos_rl.commands import launch

    manifest = ROOT / "manifests" / "sft_shapes_cpu.toml"
    overrides = [
        'model.preset="tiny"', f"rl.data.shards={json.dumps(shards)}", "rl.max_steps=2", "rl.samples_per_step=2",
        f'job.output_dir="{tmp_path}"', "job.progress=false", "grid.gpus_per_node=2",
        "model.config.parallelism.data_parallel_shard_degree=2", "job.log_every=1", "rl.eval.every=2", "rl.eval.per_task=1",
        "rl.eval.seeds=1", 'rl.eval.reward="brightness"', "rl.eval.sample_steps=2",
    ]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "cosmos_rl.cli", "train", str(manifest), *overrides, 'job.name="torchrun"'],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    config = load.load(manifest, [*overrides, 'job.name="ray"', 'grid.backend="ray"'])
    console = Console(file=io.StringIO())
    assert launch.train(config, manifest, console) == 0  # in-process: joins the session's cluster
    assert "sft: 2 Ray actors (single)" in console.file.getvalue()

    def rows(name: str) -> list[dict]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "train/samples_per_s"} for line in lines]

    assert rows("ray") == rows("torchrun") and "eval/score" in rows("ray")[1]
    assert (tmp_path / "ray" / "checkpoints" / "step_2" / "COMMITTED").is_file()
