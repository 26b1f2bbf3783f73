"""Diffusion-DPO on the world model in forward dynamics (docs/world_training.md "DPO in forward dynamics"):
`cosmos-rl pairs mine --reward pusht_forward_partial` on Push-T training-window keys, then DPO on
those pairs with frame 0 and the action rows rebuilt from each pair's key, clean and in no loss.

Tiny sizes: the Nano-layout folder with action heads (tests/_video_folders.world_nano_folder, 4x
temporal VAE: 5 frames are 2 latent frames, latent frame 0 is pixel frame 0's alone), 32x32.
"""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _inproc import cosmos
from _video_folders import world_nano_folder

from cosmos_rl.config import load, preflight
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec

CPU = torch.device("cpu")
FRAMES, CHUNK, SIZE = 5, 4, 32
PLANNER = ["pusht window seed=7 task=planner episode=0 start=0 length=8", "pusht window seed=7 task=planner episode=0 start=3 length=8"]
RANDOM = ["pusht window seed=7 task=random episode=1 start=0 length=8", "pusht window seed=7 task=random episode=1 start=3 length=8"]
KEYS = PLANNER + RANDOM


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return world_nano_folder(tmp_path_factory.mktemp("world_dpo") / "pipe", seed=3)


def _true_window(key: str):
    """The key's frames, actions and states made straight from the episode makers (the key's
    documented recipe: the env's start for seed (S, task number, I)), not through the suite."""
    from cosmos_rl.pusht.episodes import planner_episode, random_episode

    fields = dict(part.split("=") for part in key.split()[2:])
    number = ("planner", "random").index(fields["task"])
    seed = int(np.random.SeedSequence([int(fields["seed"]), number, int(fields["episode"])]).generate_state(1)[0])
    made = (planner_episode, random_episode)[number](int(fields["episode"]), seed, int(fields["length"]), (SIZE, SIZE))
    start = int(fields["start"])
    end = start + CHUNK + 1
    return made.frames[start:end], made.actions[start : end - 1], made.states[start:end]


def _config(tmp_path: Path, folder: Path, shards: list[str], **changes) -> object:
    raw = {
        "job": {"output_dir": str(tmp_path), "name": "run", "progress": False, "seed": 1, "log_every": 1},
        "model": {"path": str(folder), "dtype": "float32", "height": SIZE, "width": SIZE, "num_frames": FRAMES, "fps": 10.0,
                  "lora": {"rank": 4, "alpha": 8.0},
                  "condition": {"kind": "forward_dynamics", "source": "pusht"},
                  "action": {"embodiment": "pusht", "view_point": "ego_view", "offset": [256.0, 256.0], "scale": [256.0, 256.0]}},
        "checkpoint": {"every": 0, "keep": 0},
        "grid": {"device": "cpu"},
        "rl": {"algorithm": "dpo", "beta": 500.0, "max_steps": 2, "pairs_per_step": 2, "optimizer": {"lr": 1e-2},
               "latent_cache": "memory", "data": {"shards": shards}},
    }  # fmt: skip
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        table = raw
        for part in path:
            table = table.setdefault(part, {})
        table[last] = value
    return load.structure(raw)


def _errors(config, base: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in preflight.check(config, base):
        if p.severity == "error":
            out[p.path] = (out[p.path] + " || " if p.path in out else "") + f"{p.problem} | {p.fix}"
    return out


def _shard_meta(shard: Path) -> list[dict]:
    with tarfile.open(shard) as tar:
        return [json.load(io.BytesIO(tar.extractfile(m).read())) for m in tar.getmembers() if m.name.endswith(".json")]


def test_mined_futures_of_window_keys_train_two_dpo_steps_with_frame_0_and_the_actions_out_of_the_loss(folder, tmp_path, monkeypatch):
    from cosmos_rl.data.pairs import TarShardPairs
    from cosmos_rl.models import packing
    from cosmos_rl.models.generate import condition_latents
    from cosmos_rl.pusht import verifier
    from cosmos_rl.trainers.dpo import DPOTrainer

    # An untrained tiny model's futures fail the real verifier on every frame (every key would tie:
    # the real verifier's figures are tests/test_world_eval.py's), so the verifier seam grades a clip
    # by its brightness after frame 0, and gives the random keys' clips 0 (ties, to be dropped).
    # It still receives each clip's true states, which is what ties the pairs to their keys.
    truth = {key: _true_window(key) for key in KEYS}
    random_starts = [truth[key][2][0].tobytes() for key in RANDOM]
    judged = []

    def graded(frames, states, given=1):
        judged.append((np.asarray(states), given))
        score = 0.0 if np.asarray(states)[0].tobytes() in random_starts else float(frames[given:].mean()) / 255
        return SimpleNamespace(strict=float(score > 0.5), partial=score)

    monkeypatch.setattr(verifier, "verify_dynamics", graded)
    keys = tmp_path / "keys.txt"
    keys.write_text("\n".join(KEYS) + "\n")
    out = tmp_path / "pairs"
    mined = cosmos("pairs", "mine", folder, "--reward", "pusht_forward_partial", "--prompts", keys, "--samples", "2", "--out", out,
                   "--frames", FRAMES, "--image-size", SIZE, "--sample-steps", "2", "--device", "cpu", "--batch-size", "8")  # fmt: skip
    assert mined.returncode == 0, mined.stdout + mined.stderr
    assert 'kind = "forward_dynamics", source = "pusht"' in mined.stdout
    summary = json.loads((out / "mine.json").read_text())
    assert (summary["pairs"], summary["ties_dropped"], summary["rows"], summary["samples"]) == (2, 2, 4, 2)
    assert (summary["mode"], summary["suite"], summary["given_frames"], summary["frames"]) == ("forward_dynamics", "pusht", 1, FRAMES)
    # each key's two clips were judged against that key's true states, frame 0 given
    assert len(judged) == 8 and all(given == 1 for _, given in judged)
    for k, key in enumerate(KEYS):
        assert all(np.array_equal(states, truth[key][2]) for states, _ in judged[2 * k : 2 * k + 2])

    # the pairs: keys as prompts, the better-graded clip the winner, both sides from frame 0 of the key
    shard = Path(summary["shards"][0])
    metas = _shard_meta(shard)
    pairs = TarShardPairs([str(shard)], MediaSpec(FRAMES, SIZE, SIZE, 10.0))
    assert [pairs[0].prompt, pairs[1].prompt] == PLANNER and [m["prompt"] for m in metas] == PLANNER
    for pair, meta in zip([pairs[0], pairs[1]], metas):
        assert meta["winner_score"] == max(meta["scores"]) > meta["loser_score"] == min(meta["scores"])
        for side in ("winner", "loser"):
            clip = (getattr(pair, side).double() * 255).round()
            assert float(clip[:, 1:].mean()) / 255 == pytest.approx(meta[f"{side}_score"], abs=1e-9)  # what the verifier graded
        assert torch.equal(pair.winner[:, 0], pair.loser[:, 0])  # the given frame, decoded from one clean latent

    # DPO on them: accepted by preflight, two real steps
    config = _config(tmp_path, folder, [str(shard)])
    assert _errors(config, tmp_path) == {}
    trainer = DPOTrainer(config, tmp_path / "run", CPU)
    latents, _ = trainer._pair_tensors([pairs[0], pairs[1]])
    frame0 = torch.cat([condition_latents(trainer.model.vae, torch.from_numpy(truth[key][0][:1])) for key in PLANNER])
    assert torch.equal(latents[:, :, :1], torch.cat([frame0, frame0]))  # winners then losers: the key's frame 0, clean
    forwards, frame_grads, action_grads = [], [], []
    real_velocity = packing.velocity

    def velocity(*args, **kwargs):
        out = real_velocity(*args, **kwargs)
        forwards.append((args[3], kwargs.get("actions"), kwargs.get("action_layout"), kwargs.get("clean_frames"), torch.is_grad_enabled()))
        if torch.is_grad_enabled():  # the policy's training forward: which outputs a gradient reaches
            out[0].register_hook(lambda g: frame_grads.append(g.detach().clone()))
            if out[1].requires_grad:
                out[1].register_hook(lambda g: action_grads.append(g))
        return out

    monkeypatch.setattr("cosmos_rl.trainers.dpo.velocity", velocity)
    used, next_pairs = [], trainer.next_pairs
    trainer.next_pairs = lambda: (lambda drawn: used.append(drawn) or drawn)(next_pairs())
    before = {n: p.detach().clone() for n, p in trainer.model.transformer.named_parameters() if p.requires_grad}
    first = trainer.train_step(1)
    assert first["train/loss"] == pytest.approx(math.log(2), abs=1e-6) and first["train/grad_norm"] > 0
    second = trainer.train_step(2)
    assert second["train/loss"] != pytest.approx(math.log(2), abs=1e-6)
    moved = [n for n, p in trainer.model.transformer.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved and all("lora_" in n for n in moved)
    # reference and policy forwards, both steps: the keys' true rows, all clean, padding zero; frame 0 clean
    assert len(forwards) == 4 and [f[-1] for f in forwards] == [False, True, False, True]
    caption = "Push the T-shaped block onto the T-shaped target."
    for k, (prompt_ids, actions, layout, clean, _) in enumerate(forwards):
        order = [p.prompt for p in used[k // 2]] * 2  # winners then losers of the step's pairs
        rows = torch.stack([torch.from_numpy((truth[key][1].astype(np.float32) - 256.0) / 256.0) for key in order])
        assert clean == 1 and layout.clean_rows == (CHUNK,) * 4 and layout.widths == (2,) * 4
        assert torch.allclose(actions[:, :, :2], rows) and not actions[:, :, 2:].any()
        assert all(torch.equal(i, trainer.pair_windows.prompt_ids(PLANNER[0])) for i in prompt_ids)
    from cosmos_rl.models.actions import action_prompt_ids
    from cosmos_rl.pusht.episodes import action_spec

    expected, _ = action_prompt_ids(trainer.model.tokenizer, trainer.model.parts.prompt_template, [caption], action_spec("forward_dynamics", CHUNK),
                                    MediaSpec(FRAMES, SIZE, SIZE, 10.0))  # fmt: skip
    assert torch.equal(trainer.pair_windows.prompt_ids(PLANNER[0]), expected[0])  # the planner task's structured caption
    # no gradient reaches frame 0's velocity or the action rows' velocity
    assert len(frame_grads) == 2 and all(not g[:, :, 0].any() and g[:, :, 1:].abs().sum() > 0 for g in frame_grads)
    assert action_grads == []

    # a pair whose prompt is no key stops the run naming its row
    from cosmos_rl.data.pair_record import PromptSides

    bad = SimpleNamespace(prompt_sides=lambda: [PromptSides("p-1", "pairs-000000.tar sample '000001'", "a red circle", None, None)])
    with pytest.raises(UserError, match=r"pairs-000000\.tar sample '000001' \(id 'p-1'\): .*not a Push-T window key.*cosmos-rl pairs mine"):
        trainer.pair_windows.check(bad, "rl.data")


def test_preflight_and_the_miner_refuse_what_dpo_in_forward_dynamics_cannot_train(folder, tmp_path):
    shards = tmp_path / "pairs"
    shards.mkdir()
    shard = str(shards / "pairs-000000.tar")
    (shards / "pairs-000000.tar").write_bytes(b"")
    summary = {"mode": "forward_dynamics", "suite": "pusht", "frames": FRAMES, "image_size": SIZE, "rows": 4, "samples": 2}
    (shards / "mine.json").write_text(json.dumps(summary))

    def errors(**changes):
        found = _errors(_config(tmp_path, folder, [shard], **changes), tmp_path)
        found.pop("rl.data.shards[0]", None)  # the empty stand-in shard: the data rules' own
        return found

    assert errors() == {}
    assert "forward_dynamics in this release, not policy" in errors(model__condition__kind="policy")["model.condition.kind"]
    no_key = errors(model__condition__source="shapes_video")
    assert "training-window keys" in no_key["model.condition.source"] and "pusht" in no_key["model.condition.source"]
    assert "trains LoRA" in errors(model__lora={"rank": 0})["model.lora.rank"]
    assert "cosmos-rl eval RUN --suite" in errors(rl__eval={"every": 5})["rl.eval.every"]
    synthetic = errors(rl__data={"synthetic_pairs": 8})["rl.data.synthetic_pairs"]
    assert "pairs of window keys" in synthetic and "cosmos-rl pairs mine --reward pusht_forward_strict" in synthetic
    # the pairs' mine.json against the run: another clip length, and a run without the condition
    assert "holds pairs of 5-frame clips" in errors(model__num_frames=9)["rl.data.shards"]
    plain = errors(model__condition={"kind": "none"}, model__action={})
    assert "holds forward_dynamics pairs of pusht window keys" in plain["rl.data.shards"] and "[model.condition]" in plain["rl.data.shards"]
    summary.pop("mode")
    (shards / "mine.json").write_text(json.dumps(summary))
    assert "holds pairs mined from captions" in errors()["rl.data.shards"]

    # the miner: a row that is no key, named by file:line, before any model loads; a reducer refused
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{KEYS[0]}\npusht window seed=50000 task=planner episode=0 start=0 length=8\n")
    args = ["pairs", "mine", folder, "--reward", "pusht_forward_partial", "--prompts", keys, "--frames", FRAMES, "--image-size", SIZE]
    held_out = cosmos(*args, "--out", tmp_path / "m1")
    assert held_out.returncode != 0 and f"{keys}:2" in held_out.stdout + held_out.stderr and "held-out split" in held_out.stdout + held_out.stderr
    reduced = cosmos(*args, "--out", tmp_path / "m2", "--frame-reduce", "mean")
    assert reduced.returncode != 0 and "--frame-reduce mean: plays no part" in reduced.stdout + reduced.stderr
