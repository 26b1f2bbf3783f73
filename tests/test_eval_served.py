"""`cosmos-rl eval` and `pairs mine` with the rewards a run trains on: a model reward from a local
folder (a tiny random PickScore-shaped CLIP folder, save_pretrained from the real classes), a
reward service at a url (the real service in-process on loopback, with a token), several weighted;
and each mistake a user can make named in one line."""

from __future__ import annotations

import io
import json
import shutil
import socket
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from _reward_models import tiny_clip_folder
from cosmos_rl.core.errors import UserError

RUN = Path(__file__).parent / "fixtures" / "old_runs" / "nft_lora"  # a tiny LoRA NFT run, committed at step 2
PROMPTS = ["a cat asleep on a red mat", "an old lighthouse at dusk", "two apples on a table"]  # the user's own: no suite grammar
SMALL = {"seeds": 2, "sample_steps": 4, "device": "cpu"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    run = root / "run"
    shutil.copytree(RUN, run)
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    return run, prompts, tiny_clip_folder(root / "pickscore")


@pytest.fixture(scope="module")
def by_folder(setup):
    from cosmos_rl.commands.evaluate import run_eval

    run, prompts, folder = setup
    return run_eval(str(run), reward=[f"pickscore={folder}"], prompts=prompts, out_dir=run / "eval_pick", **SMALL)


def test_a_model_reward_from_a_folder_scores_a_checkpoint_against_its_base_with_intervals(setup, by_folder):
    from cosmos_rl.commands.eval_result import read
    from cosmos_rl.rewards.models import revision_of

    run, _, folder = setup
    out = by_folder
    assert out["kind"] == "run" and out["step"] == 2 and out["reward"] == "pickscore" and out["n_images"] == 6
    # The user's prompts are no suite's captions: one task, no verifier, no partial score.
    assert list(out["tasks"]) == ["other"] and out["score_partial"] is None and out["base_score"] is not None
    assert out["diff_score"] == pytest.approx(out["score"] - out["base_score"])
    lo, hi = out["score_interval"]
    assert lo <= out["score"] <= hi and out["diff_score_interval"][0] <= out["diff_score"] <= out["diff_score_interval"][1]
    assert len(out["prompt_scores"]["other"]) == len(PROMPTS)
    assert out["rewards"] == [{"name": "pickscore", "weight": 1.0, "folder": str(folder.resolve()), "url": None,
                               "revision": revision_of("pickscore", folder.resolve())}]  # fmt: skip
    assert out["reward_dimensions"] is None and out["base_reward_dimensions"] is None  # PickScore has no named dimensions
    # A random CLIP scores outside [0, 1]: the file check takes a model reward's scale, not a verifier's.
    assert not all(0.0 <= v <= 1.0 for v in (*out["prompt_scores"]["other"], *out["base_prompt_scores"]["other"]))
    assert read(run / "eval_pick" / "eval.json", "eval.json") == out


def test_a_service_url_with_a_token_scores_what_the_folder_scores(setup, by_folder, monkeypatch):
    from cosmos_rl.commands.evaluate import run_eval
    from cosmos_rl.rewards.server import RewardServer

    run, prompts, folder = setup
    monkeypatch.setenv("EVAL_REWARD_TOKEN", "s3cret")
    with RewardServer(revision="pick-1", token="s3cret", models={"pickscore": str(folder)}) as server:
        out = run_eval(str(run), reward=["pickscore"], reward_url=server.url, reward_token_env="EVAL_REWARD_TOKEN", prompts=prompts,
                       out_dir=run / "eval_url", **SMALL)  # fmt: skip
        # The same weights behind a url give the same numbers; the service's revision is read and recorded.
        assert out["prompt_scores"] == by_folder["prompt_scores"] and out["base_score"] == by_folder["base_score"]
        assert out["rewards"][0]["url"] == server.url and out["rewards"][0]["revision"] == by_folder["rewards"][0]["revision"]
        monkeypatch.delenv("EVAL_REWARD_TOKEN")
        with pytest.raises(UserError, match="^--reward-token-env EVAL_REWARD_TOKEN: the variable is not set; export EVAL_REWARD_TOKEN=TOKEN"):
            run_eval(str(run), reward=["pickscore"], reward_url=server.url, reward_token_env="EVAL_REWARD_TOKEN", prompts=prompts,
                     out_dir=run / "eval_url", **SMALL)  # fmt: skip
        with pytest.raises(UserError, match=f"^the reward service at {server.url} refused the bearer token .*; pass --reward-token-env VAR"):
            run_eval(str(run), reward=["pickscore"], reward_url=server.url, prompts=prompts, out_dir=run / "e", **SMALL)
        monkeypatch.setenv("EVAL_REWARD_TOKEN", "s3cret")
        with pytest.raises(UserError, match=f"^--reward aesthetic: the service at {server.url} offers no 'aesthetic'; pick one of"):
            run_eval(str(run), reward=["aesthetic"], reward_url=server.url, reward_token_env="EVAL_REWARD_TOKEN", prompts=prompts,
                     out_dir=run / "e", **SMALL)  # fmt: skip


def test_several_rewards_give_the_weighted_sum_of_each():
    """Two built-in rewards served and weighted (through the services and client a run's
    `[[rl.rewards]]` use) against each function called in-process: the weighted sum, image by image."""
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.evaluation.served import ServedRewards, label, served_terms
    from cosmos_rl.rewards.functions import REWARDS

    terms = served_terms(["brightness", "jpeg_compressibility"], weights=["brightness=2", "jpeg_compressibility=0.5"])
    assert label(terms) == "2*brightness+0.5*jpeg_compressibility"
    images = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    with ServedRewards(terms, MediaSpec(frames=1, height=16, width=16)) as served:
        scores = served.score(images, PROMPTS)
        assert [r["weight"] for r in served.describe()] == [2.0, 0.5]
    expected = [2 * a + 0.5 * b for a, b in zip(REWARDS["brightness"](images, PROMPTS), REWARDS["jpeg_compressibility"](images, PROMPTS))]
    assert scores == pytest.approx(expected, abs=1e-9)


def test_pairs_mine_ranks_by_a_model_reward(setup, tmp_path):
    from cosmos_rl.commands.mining.command import run_mine
    from cosmos_rl.rewards.models import ClipRewardModel

    run, prompts, folder = setup
    summary = run_mine(str(run), reward=[f"pickscore={folder}"], prompts=prompts, samples=3, out_dir=tmp_path / "pairs",
                       sample_steps=4, device="cpu")  # fmt: skip
    assert summary["reward"] == "pickscore" and summary["ranked_by"] == "score" and summary["pairs"] == len(PROMPTS)
    # Each pair's winner and loser, read back from the shard, score what the pair says under the model itself.
    model = ClipRewardModel("pickscore", folder, device="cpu")
    with tarfile.open(summary["shards"][0]) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    keys = sorted(name[: -len(".json")] for name in members if name.endswith(".json"))
    assert len(keys) == len(PROMPTS)
    for key in keys:
        meta = json.loads(members[f"{key}.json"])
        images = [np.asarray(Image.open(io.BytesIO(members[f"{key}.{side}.png"])).convert("RGB")) for side in ("winner", "loser")]
        assert model(np.stack(images), [meta["prompt"]] * 2) == pytest.approx([meta["winner_score"], meta["loser_score"]], abs=1e-4)
        assert meta["winner_score"] == max(meta["scores"]) > meta["loser_score"] == min(meta["scores"])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_reward_mistake_names_the_option_what_was_found_and_the_fix(setup, tmp_path):
    from cosmos_rl.commands.evaluate import run_eval
    from cosmos_rl.commands.mining.command import run_mine
    from cosmos_rl.rewards.registry import Reward, builtin_rewards
    from cosmos_rl.rewards.server import RewardServer

    run, prompts, folder = setup
    bad = [
        (["pickscor=" + str(folder)], {}, "^--reward pickscor=.*: unknown model reward 'pickscor'; a folder is for one of pickscore, clipscore, aesthetic, hps, videoalign$"),
        (["nope"], {}, "^--reward: 'nope' is not a built-in weight-free reward of the suite shapes; use one of .*, a model reward's folder "
                       r"\(pickscore=FOLDER, .* or --reward-url URL for a service's$"),
        (["nope", "brightness"], {}, "^--reward nope: unknown reward; use a built-in one .* or --reward-url URL for a service's$"),
        (["pickscore"], {}, "^--reward pickscore: a model reward needs its weights; pass --reward pickscore=FOLDER"),
        ([f"pickscore={tmp_path / 'missing'}"], {}, "^--reward pickscore=.*missing: folder not found; pass a local folder with a transformers CLIP"),
        (["pickscore"], {"reward_url": f"http://127.0.0.1:{_closed_port()}"}, "^--reward-url http://127.0.0.1:.*: the reward service cannot be reached .*; start it"),
        (["pickscore"], {"reward_url": "localhost:8000"}, "^--reward-url 'localhost:8000': not an http:// or https:// URL"),
        ([f"pickscore={folder}"], {"reward_weights": ["pickscore=-1"]}, "^--reward-weight pickscore=-1: the weight must be a finite number > 0"),
    ]  # fmt: skip
    for rewards, extra, message in bad:
        with pytest.raises(UserError, match=message):
            run_eval(str(run), reward=rewards, prompts=prompts, out_dir=tmp_path / "e", **SMALL, **extra)
    with pytest.raises(UserError, match="^--reward nope: unknown reward"):
        run_mine(str(run), reward=["nope", "brightness"], prompts=prompts, samples=2, out_dir=tmp_path / "m")
    # A reward whose output is not a score: the service answers, the scores are not numbers.
    junk = {**builtin_rewards(), "junk": Reward("junk", lambda images, prompts: [float("nan")] * len(images), "junk:1")}
    with RewardServer(revision="junk-1", registry=junk) as server:
        with pytest.raises(UserError, match="^--reward junk: the reward service gave no scores .*; fix the service"):
            run_eval(str(run), reward=["junk"], reward_url=server.url, prompts=prompts, out_dir=tmp_path / "j", **SMALL)


def test_a_runs_eval_rewards_tables_score_its_evaluation_during_training(setup):
    """`[[rl.eval.rewards]]` (the `[[rl.rewards]]` table): training's evaluation scores with them,
    `eval/score` the weighted mean of what the model reward gives the images sampled."""
    from cosmos_rl.config import load
    from cosmos_rl.models.build import build_preset
    from cosmos_rl.evaluation.evaluator import Evaluator
    from cosmos_rl.rewards.models import ClipRewardModel

    _, prompts, folder = setup
    config = load.load(Path(__file__).parents[1] / "manifests" / "nft_t2i_smoke.toml", [
        "rl.eval.every=1", f'rl.eval.prompts="{prompts}"', "rl.eval.seeds=1",
        f'rl.eval.rewards=[{{name="pickscore", weight=0.5, revision="r1", model="{folder}"}}]'])  # fmt: skip
    evaluator = Evaluator.for_run(config, build_preset("tiny", 0), None)
    images = np.random.default_rng(1).integers(0, 256, (len(PROMPTS), 32, 32, 3), dtype=np.uint8)
    evaluator.sample = lambda transformer, items: images[[item.prompt for item in items]]
    assert evaluator.reward == "0.5*pickscore"
    metrics = evaluator.evaluate(None).metrics()
    own = ClipRewardModel("pickscore", folder, device="cpu")(images, PROMPTS)
    assert metrics["eval/score"] == pytest.approx(0.5 * sum(own) / len(own), abs=1e-5) and "eval/score_partial" not in metrics


@pytest.mark.parametrize("command", ["eval", "pairs"])
def test_the_command_lines_pass_every_reward_option(command, setup, monkeypatch):
    """`cosmos-rl eval` and `pairs mine` hand --reward (repeated), --reward-url, --reward-weight and
    --reward-token-env to the command; a mistake exits 2 with its one line."""
    from typer.testing import CliRunner

    from cosmos_rl.cli import app

    run, prompts, folder = setup
    seen = {}
    monkeypatch.setattr(f"cosmos_rl.commands.{'evaluate.run_eval' if command == 'eval' else 'mining.command.run_mine'}",
                        lambda target, **kw: seen.update(kw) or {})  # fmt: skip
    head = ["eval", str(run)] if command == "eval" else ["pairs", "mine", str(run), "--samples", "2", "--out", str(run / "p")]
    args = [*head, "--prompts", str(prompts), "--reward", f"pickscore={folder}", "--reward", "aesthetic", "--reward-url", "http://127.0.0.1:9",
            "--reward-weight", "aesthetic=0.25", "--reward-token-env", "TOKEN", "--json"]  # fmt: skip
    CliRunner().invoke(app, args)
    assert seen["reward"] == [f"pickscore={folder}", "aesthetic"] and seen["reward_url"] == "http://127.0.0.1:9"
    assert list(seen["reward_weights"]) == ["aesthetic=0.25"] and seen["reward_token_env"] == "TOKEN"
    monkeypatch.undo()
    result = CliRunner().invoke(app, [*head, "--prompts", str(prompts), "--reward", "pickscore=/no/such/folder"])
    assert result.exit_code == 2 and "--reward pickscore=/no/such/folder: folder not found" in " ".join(result.output.split())


def test_eval_of_a_run_with_eval_rewards_tables_scores_with_them(setup, by_folder, tmp_path):
    """`cosmos-rl eval RUN_DIR` with no --reward scores with the run's `[[rl.eval.rewards]]` (not
    part of the run identity: the checkpoint still belongs to the run)."""
    from cosmos_rl.commands.evaluate import run_eval

    run, prompts, folder = setup
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval*"))
    with (copy / "manifest.toml").open("a") as manifest:
        manifest.write(f'\n[[rl.eval.rewards]]\nname = "pickscore"\nmodel = "{folder}"\nrevision = "r1"\n')
    out = run_eval(str(copy), prompts=prompts, out_dir=copy / "eval", **SMALL)
    assert out["reward"] == "pickscore" and out["rewards"][0]["folder"] == str(folder)
    assert out["prompt_scores"] == by_folder["prompt_scores"] and out["base_prompt_scores"] == by_folder["base_prompt_scores"]
