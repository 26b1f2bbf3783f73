"""The DPO loop in one process (no torchrun): objective at step 0, learning, validation, data checks,
checkpoint contents, an in-process exact resume, and the full fine-tune reference."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import attrs
import pytest
import torch
from PIL import Image

from cosmos_rl.config import load
from cosmos_rl.core.errors import UserError
from cosmos_rl.models.packing import velocity
from cosmos_rl.trainers.dpo import DPOTrainer

CPU = torch.device("cpu")


def make_config(tmp_path: Path, **rl):
    lora_rank = rl.pop("lora_rank", 8)
    raw = {
        "job": {"output_dir": str(tmp_path), "name": "run", "progress": False, "seed": 3},
        "model": {"preset": "tiny", "lora": {"rank": lora_rank}},
        "checkpoint": {"every": 0, "keep": 0},
        "rl": {
            "algorithm": "dpo",
            "beta": 500.0,
            "max_steps": 2,
            "pairs_per_step": 2,
            "optimizer": {"lr": 1e-3},
            "data": {"synthetic_pairs": 16},
            **rl,
        },
    }
    return load.structure(raw)


def trainer(tmp_path: Path, resume: bool = False, **rl) -> DPOTrainer:
    return DPOTrainer(make_config(tmp_path, **rl), tmp_path / "run", CPU, resume=resume)


@pytest.mark.parametrize("lora_rank", [8, 0], ids=["lora", "full"])
def test_first_step_loss_is_log2_because_policy_equals_reference(tmp_path, lora_rank):
    metrics = trainer(tmp_path, lora_rank=lora_rank).train_step(1)
    assert metrics["train/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["train/dpo_accuracy"] == 0.5
    assert metrics["train/dpo_reward_margin"] == 0.0
    assert metrics["train/policy_mse_winner"] == metrics["train/ref_mse_winner"]
    assert metrics["train/policy_mse_loser"] == metrics["train/ref_mse_loser"]
    assert metrics["train/lr"] == 1e-3


def _fixed_objective(t: DPOTrainer, pairs, repeats: int = 4) -> dict[str, float]:
    """The DPO objective on `pairs` under fixed noise (each pair at `repeats` noise/time draws)."""
    latents, ids = t._pair_tensors(pairs)
    half = len(pairs)
    ones = [1] * (latents.dim() - 1)
    latents = torch.cat([latents[:half].repeat(repeats, *ones), latents[half:].repeat(repeats, *ones)])
    ids = ids[:half] * repeats * 2
    gen = torch.Generator().manual_seed(1234)
    eps = torch.randn((half * repeats, *latents.shape[1:]), generator=gen)
    times = torch.rand(half * repeats, generator=gen)
    with torch.no_grad():
        _, metrics = t._objective(latents, ids, eps, times, with_grad=False)
    return {k: float(v) for k, v in metrics.items()}


def test_training_steps_lower_the_loss_and_raise_accuracy_on_the_trained_pairs(tmp_path):
    # Four pairs seen every step (under fresh noise each step): the objective on them, measured
    # under one fixed set of noise draws, must improve from the log-2 start.
    t = trainer(tmp_path, max_steps=12, pairs_per_step=4, data={"synthetic_pairs": 4})
    pairs = [t.train_source[i] for i in range(4)]
    before = _fixed_objective(t, pairs)
    assert before["loss"] == pytest.approx(math.log(2), abs=1e-6)
    t.run()
    after = _fixed_objective(t, pairs)
    assert after["loss"] < before["loss"] - 0.05
    assert after["dpo_accuracy"] > 0.5
    assert after["dpo_reward_margin"] > 0.0


def test_metrics_rows_validation_and_checkpoint_contents(tmp_path):
    t = trainer(
        tmp_path,
        max_steps=2,
        validation={"every": 2, "max_pairs": 3, "data": {"synthetic_pairs": 8, "synthetic_seed": 1}},
    )
    t.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    train_keys = {
        "train/loss", "train/dpo_accuracy", "train/dpo_reward_margin", "train/policy_mse_winner",
        "train/policy_mse_loser", "train/ref_mse_winner", "train/ref_mse_loser", "train/lr", "train/pairs_per_s",
    }  # fmt: skip
    assert train_keys <= set(rows[0]) and not any(k.startswith("val/") for k in rows[0])
    assert {"val/loss", "val/dpo_accuracy", "val/dpo_reward_margin"} <= set(rows[1])
    assert all(math.isfinite(rows[1][k]) for k in ("val/loss", "val/dpo_accuracy"))

    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_2" / "meta.json").read_text())
    assert set(meta["components"]) == {"policy", "optimizer", "lr_schedule", "progress", "data_cursor", "rng"}
    metadata = torch.distributed.checkpoint.FileSystemReader(
        str(tmp_path / "run" / "checkpoints" / "step_2")
    ).read_metadata()
    policy_keys = [k for k in metadata.state_dict_metadata if k.startswith("policy.")]
    # LoRA run: only adapter tensors are saved, and nothing of a reference.
    assert policy_keys and all("lora_" in k for k in policy_keys)
    assert not any(k.startswith("ref") for k in metadata.state_dict_metadata)


def test_validation_is_the_same_objective_at_step_zero(tmp_path):
    t = trainer(tmp_path, validation={"every": 1, "max_pairs": 4, "data": {"synthetic_pairs": 8, "synthetic_seed": 1}})
    val = t.validate()
    assert val["val/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert val["val/dpo_accuracy"] == 0.5


def test_leakage_between_train_and_validation_stops_the_run_before_training(tmp_path):
    # Preflight refuses equal synthetic seeds; the trainer's own audit is the last line of defence.
    with pytest.raises(UserError, match=r"rl\.validation: 16 validation id\(s\) also appear"):
        trainer(tmp_path, validation={"every": 1, "data": {"synthetic_pairs": 16, "synthetic_seed": 0}})
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def _png(path: Path, value: int) -> str:
    Image.new("RGB", (32, 32), (value, value, value)).save(path)
    return path.name


def test_preference_symmetry_mismatch_stops_the_run_naming_the_row(tmp_path):
    rows = []
    for i, loser_prompt in enumerate(["a red square", "a blue circle"]):
        rows.append(
            {
                "id": f"p{i}",
                "prompt": "a red square",
                "winner": _png(tmp_path / f"w{i}.png", 200),
                "loser": _png(tmp_path / f"l{i}.png", 20),
                "winner_prompt": "a red square",
                "loser_prompt": loser_prompt,
            }
        )
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError, match=r"pairs\.jsonl:2 \(id 'p1'\): loser_prompt 'a blue circle'"):
        trainer(tmp_path, data={"jsonl": str(jsonl)})


def test_synthetic_pairs_win_over_a_file_source(tmp_path):
    t = trainer(tmp_path, data={"synthetic_pairs": 16, "jsonl": str(tmp_path / "missing.jsonl")})
    assert len(t.train_source) == 16


def test_full_finetune_trains_every_weight_and_keeps_the_reference_frozen(tmp_path):
    t = trainer(tmp_path, lora_rank=0, max_steps=2)
    reference = t.model.frozen_ref
    assert reference is not t.model.transformer
    assert not any(p.requires_grad for p in reference.parameters())
    assert not any(p.requires_grad for p in t.model.vae.parameters())
    ref_before = {k: v.clone() for k, v in reference.state_dict().items()}
    policy_before = {k: v.clone() for k, v in t.model.transformer.state_dict().items()}
    t.run()
    for key, value in reference.state_dict().items():
        assert torch.equal(value, ref_before[key]), key
    changed = [k for k, v in t.model.transformer.state_dict().items() if not torch.equal(v, policy_before[k])]
    assert any(k.startswith("layers.0.") for k in changed) and any(k.startswith("proj_in") for k in changed)

    # The reference is what the policy was at setup: same outputs as a fresh base.
    latents = torch.randn(1, 4, 1, 8, 8)
    ids = [t.prompt_ids("a red square")]
    fresh = trainer(tmp_path / "fresh", lora_rank=0)
    with torch.no_grad():
        assert torch.equal(
            velocity(reference, latents, torch.tensor([0.5]), ids),
            velocity(fresh.model.transformer, latents, torch.tensor([0.5]), ids),
        )
    meta = torch.distributed.checkpoint.FileSystemReader(
        str(tmp_path / "run" / "checkpoints" / "step_2")
    ).read_metadata()
    saved = {k for k in meta.state_dict_metadata if k.startswith("policy.")}
    assert "policy.proj_in.weight" in saved and not any("lora_" in k for k in saved)


def _policy_tensors(t: DPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.model.transformer.state_dict().items()}


def test_in_process_resume_continues_exactly(tmp_path):
    """4 straight steps == 2 steps, a checkpoint, and a fresh trainer resuming for 2 more."""
    straight = trainer(tmp_path / "a", max_steps=4)
    rows_a = straight.run()

    run_b = tmp_path / "b" / "run"
    config = make_config(tmp_path / "b", max_steps=4)
    config = attrs.evolve(config, checkpoint=attrs.evolve(config.checkpoint, every=2))
    # max_steps is not an identity field: stopping early and resuming with the full target is allowed.
    rows_b = DPOTrainer(attrs.evolve(config, rl=attrs.evolve(config.rl, max_steps=2)), run_b, CPU).run()
    resumed = DPOTrainer(config, run_b, CPU, resume=True)
    assert resumed.step == 2
    rows_b += resumed.run()

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "train/pairs_per_s"} for r in rows]

    assert [r["step"] for r in rows_b] == [1, 2, 3, 4]
    assert strip(rows_a) == strip(rows_b)
    a, b = _policy_tensors(straight), _policy_tensors(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    lines = (run_b / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path):
    config = make_config(tmp_path, max_steps=1)
    DPOTrainer(config, tmp_path / "run", CPU).run()
    other = attrs.evolve(config, rl=attrs.evolve(config.rl, beta=10.0))
    with pytest.raises(UserError, match="run identity"):
        DPOTrainer(other, tmp_path / "run", CPU, resume=True)


def test_resume_skips_a_damaged_newest_checkpoint_for_the_older_one(tmp_path, capsys):
    """step_4 is truncated: the resume warns, sets it aside, continues from step_2 and re-runs 3-4
    exactly as the straight run did."""
    config = make_config(tmp_path, max_steps=4)
    config = attrs.evolve(config, checkpoint=attrs.evolve(config.checkpoint, every=2))
    straight = DPOTrainer(config, tmp_path / "run", CPU).run()
    damaged = next((tmp_path / "run" / "checkpoints" / "step_4").glob("*.distcp"))
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])

    resumed = DPOTrainer(config, tmp_path / "run", CPU, resume=True)
    err = capsys.readouterr().err
    assert resumed.step == 2
    assert "cannot be loaded" in err and "step_4" in err and "moved the unloadable" in err
    rows = resumed.run()

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "train/pairs_per_s"} for r in rows]

    assert strip(rows) == strip(straight[2:])
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert "step_2" in names and "step_4" in names and any(n.startswith("step_4.unloadable-") for n in names)


def test_resume_fails_naming_every_reason_when_no_checkpoint_loads(tmp_path):
    config = make_config(tmp_path, max_steps=2)
    config = attrs.evolve(config, checkpoint=attrs.evolve(config.checkpoint, every=1))
    DPOTrainer(config, tmp_path / "run", CPU).run()
    for step in (1, 2):
        (tmp_path / "run" / "checkpoints" / f"step_{step}" / ".metadata").write_bytes(b"garbage")
    with pytest.raises(UserError, match=r"none of the 2 committed checkpoints .*step_2.*step_1"):
        DPOTrainer(config, tmp_path / "run", CPU, resume=True)


def test_a_step_and_validation_run_their_forwards_inside_one_gathering_block(tmp_path, monkeypatch):
    """Under FSDP2 each block gathers a sharded layer once for the reference forward, the policy
    forward and the backward of a step (validation: every chunk's two forwards); here, unsharded,
    the blocks are no-ops, so the test records which block each forward and the backward ran in."""
    import cosmos_rl.dist.fsdp as fsdp
    import cosmos_rl.trainers.dpo as dpo_module

    open_block, seen = [None], []

    def recording(name):
        @contextlib.contextmanager
        def block(transformer):
            open_block[0] = (name, transformer)
            try:
                yield
            finally:
                open_block[0] = None

        return block

    def recorded_velocity(model, *args, **kwargs):
        out = velocity(model, *args, **kwargs)
        seen.append(("forward", open_block[0]))
        if out.requires_grad:
            out.register_hook(lambda grad: seen.append(("backward", open_block[0])))
        return out

    monkeypatch.setattr(fsdp, "gathered_while_training", recording("training"))
    monkeypatch.setattr(fsdp, "gathered_while_sampling", recording("sampling"))
    monkeypatch.setattr(dpo_module, "velocity", recorded_velocity)
    t = trainer(tmp_path, validation={"every": 1, "max_pairs": 4, "data": {"synthetic_pairs": 8, "synthetic_seed": 1}})
    t.train_step(1)
    assert [kind for kind, _ in seen] == ["forward", "forward", "backward"]  # reference, policy, backward
    assert all(block == ("training", t.model.transformer) for _, block in seen)
    seen.clear()
    t.validate()
    assert len(seen) == 4 and all(block == ("sampling", t.model.transformer) for _, block in seen)  # 2 chunks x 2
