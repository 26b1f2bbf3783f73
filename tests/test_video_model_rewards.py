"""Video model rewards end to end: a 2-step NFT video run on the session's Ray cluster rewarded at
once by VideoAlign and HPSv2.1 served from local folders (the run starts a built-in service per
reward) and by a VLM judge behind a stand-in chat server on 127.0.0.1; each reward's metrics, and
VideoAlign's per-dimension ones, reach metrics.jsonl and `cosmos-rl report`.

Tiny sizes as tests/test_nft_video.py: the shapes base, 5 frames at 32x32, a group of 2, one prompt
row, 2 sampler steps, one training timestep per clip. Each reward is one `[[rl.rewards]]` table in
`_reward_tables`; another model reward is one more line there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from _judge_server import MODEL as JUDGE_MODEL
from _judge_server import StandIn
from _reward_models import OPENCLIP_TINY, eot_last_tokenizer, openclip_state, tiny_videoalign_folder
from cosmos_rl.commands import launch
from cosmos_rl.config import load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "nft_video_shapes_cpu.toml"
TINY = ["model.num_frames=5", "rl.group_size=2", "rl.prompts_per_step=1", "rl.timesteps_per_sample=1", "rl.sample_steps=2",
        "rl.max_steps=2", "rl.eval.every=0", "rl.sample_grid_every=0", "checkpoint.every=0", "checkpoint.keep=0",
        "job.progress=false", "job.log_every=1"]  # fmt: skip
REVISION = "video-models-1"


def _table(name: str, folder: Path, weight: float = 1.0) -> str:
    from cosmos_rl.rewards.registry import model_reward

    pin = model_reward(name, folder, device="cpu").revision  # the weights' hash the run pins
    return f'{{name="{name}", weight={weight}, revision="{REVISION}", model={json.dumps(str(folder))}, reward_revision="{pin}"}}'


def _hps_folder(tmp_path: Path) -> Path:
    """A tiny open_clip-layout checkpoint nested as the release is, through `convert_hps`."""
    import torch

    from cosmos_rl.rewards.hps_convert import convert_hps

    source = tmp_path / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": openclip_state(0)}, source)
    folder = tmp_path / "hps"
    convert_hps(source, folder, eot_last_tokenizer(tmp_path / "tok"), vision_heads=OPENCLIP_TINY["vision_heads"],
                text_heads=OPENCLIP_TINY["text_heads"])  # fmt: skip
    return folder


def _reward_tables(tmp_path: Path, judge_url: str) -> list[str]:
    """The run's `[[rl.rewards]]`: two model rewards (each its own built-in service) and the judge."""
    judge = f'{{name="vlm_judge", weight=0.1, revision="judge-1", url="{judge_url}", max_retries=0, judge={{model="{JUDGE_MODEL}"}}}}'
    return [
        _table("videoalign", tiny_videoalign_folder(tmp_path / "videoalign")),
        _table("hps", _hps_folder(tmp_path)),
        judge,
    ]


@pytest.fixture
def judge_server():
    server = StandIn()
    server.by_brightness = True  # a judge that likes bright clips (the first sampled frame's mean level)
    yield server
    server.close()


def test_nft_video_run_rewarded_by_videoalign_hps_and_a_judge_logs_each_and_reports_them(ray_cluster, judge_server, tmp_path):
    tables = _reward_tables(tmp_path, judge_server.url)
    prompts = f'rl.prompts.file="{REPO / "manifests" / "shapes_video_train.txt"}"'
    overrides = [*TINY, prompts, f'job.output_dir="{tmp_path / "out"}"', "rl.reward={}", f"rl.rewards=[{', '.join(tables)}]"]
    config = load.load(MANIFEST, overrides)
    assert launch.train(config, MANIFEST, Console(stderr=True)) == 0
    run_dir = tmp_path / "out" / config.job.name
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    dims = [f"train/videoalign.{d}/reward_mean" for d in ("vq", "mq", "ta")]
    for row in rows:
        assert all(key in row and f"{key[:-len('mean')]}std" in row for key in dims), sorted(row)
        # the reward trained on is VideoAlign's Overall: the sum of its three dimensions
        assert row["train/videoalign/reward_mean"] == pytest.approx(sum(row[k] for k in dims), rel=1e-6, abs=1e-9)
    for name in ("hps", "vlm_judge"):
        assert all(f"train/{name}/reward_mean" in row for row in rows), name
    assert all(0.0 < row["train/vlm_judge/reward_mean"] < 10.0 for row in rows)
    # every clip of both steps (2 steps x a group of 2) went to the judge once, its frames in one message
    assert len(judge_server.requests) == 2 * 2
    report = subprocess.run([sys.executable, "-m", "cosmos_rl.cli", "report", str(run_dir)], cwd=REPO, capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    text = (run_dir / "report" / "report.md").read_text()
    for key in [*dims, "train/hps/reward_mean", "train/vlm_judge/reward_mean"]:
        assert key in text, key
