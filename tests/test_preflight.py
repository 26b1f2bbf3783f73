"""Every preflight rule of the specs, each with a broken variant that must name its key."""

import shutil
from pathlib import Path

import pytest
from _model_folders import stub_model_folder

from cosmos_rl.config import load, preflight

ROOT = Path(__file__).resolve().parent.parent
NFT = ROOT / "manifests" / "nft_t2i_smoke.toml"
DPO = ROOT / "manifests" / "dpo_t2i_smoke.toml"
SFT = ROOT / "manifests" / "sft_shapes_cpu.toml"  # its shards are unwritten here: only rl.data.shards[0] besides
DPO_PUBLIC = ROOT / "manifests" / "dpo_t2i_public_4gpu.toml"  # names no model: model.path is the test's
GRPO = ROOT / "manifests" / "grpo_shapes_cpu.toml"  # Flow-GRPO-Fast: sde_window = 2 over sde_window_range = [0, 5]
PLAIN = ["rl.sde_window=0", "rl.sde_window_range=[]", 'rl.scheduler="sde"', "rl.noise_level=0.7"]  # the same manifest as plain Flow-GRPO


def errors(manifest: Path, overrides: list[str]) -> dict[str, str]:
    config, problems = load.load_all_problems(manifest, overrides)
    return {p.path: p.render() for p in problems if p.severity == "error"}


def warnings(manifest: Path, overrides: list[str]) -> dict[str, str]:
    _, problems = load.load_all_problems(manifest, overrides)
    return {p.path: p.render() for p in problems if p.severity == "warning"}


PUBLIC = sorted((ROOT / "manifests").glob("*_public_*gpu.toml"))  # the 4-GPU image and 8-GPU video ones
# CPU manifests of a base that does not ship yet (the Push-T world model's): refused naming the model
# until it is given (tests/test_nft_world.py passes them with a folder that has action heads).
AWAITING_BASE = {ROOT / "manifests" / "nft_pusht_dynamics_cpu.toml", ROOT / "manifests" / "nft_pusht_policy_cpu.toml"}
SMOKE = sorted(set((ROOT / "manifests").glob("*.toml")) - set(PUBLIC) - AWAITING_BASE)


@pytest.mark.parametrize("manifest", SMOKE, ids=lambda p: p.name)
def test_shipped_smoke_manifests_pass_preflight(manifest, shipped_manifests):
    # From a copy beside the data the shapes manifests' headers say to write first.
    assert errors(shipped_manifests / manifest.name, []) == {}


@pytest.mark.parametrize("manifest", sorted(AWAITING_BASE), ids=lambda p: p.name)
def test_manifests_awaiting_their_base_are_refused_naming_the_model_alone(manifest, shipped_manifests):
    found = errors(shipped_manifests / manifest.name, [])
    assert list(found) == ["model.path", "rl.init_from"] and "no model named" in found["model.path"], found


@pytest.mark.parametrize("manifest", ["dpo_t2i_smoke.toml", "nft_t2i_smoke.toml", "sft_shapes_cpu.toml"])
def test_bfloat16_on_the_cpu_passes_preflight(manifest, shipped_manifests):
    # The public manifests' dtype on a CPU manifest: slow there, but the GPU path runs (docs/troubleshooting.md).
    assert errors(shipped_manifests / manifest, ['model.dtype="bfloat16"', 'grid.device="cpu"']) == {}


@pytest.mark.parametrize("name", ["dpo_shapes_cpu.toml", "sft_shapes_cpu.toml"])
def test_a_shapes_manifest_whose_shards_are_not_written_yet_is_refused_naming_them(name, tmp_path):
    (tmp_path / "manifests").mkdir()
    shutil.copy(ROOT / "manifests" / name, tmp_path / "manifests" / name)
    found = errors(tmp_path / "manifests" / name, [])
    assert list(found) == ["rl.data.shards[0]"], found
    first = str(tmp_path / "shapes" / ("pairs/pairs-000000.tar" if name.startswith("dpo") else "sft/shapes-000000.tar"))
    assert first in found["rl.data.shards[0]"] and "write the shards first" in found["rl.data.shards[0]"]
    if name.startswith("sft"):
        assert "20 of 20 shards not found" in found["rl.data.shards[0]"]


ONE_OFF = ["rl.reward={}"]  # the smoke manifest's [rl.reward] set back to defaults: "not given"


@pytest.mark.parametrize("manifest", PUBLIC, ids=lambda p: p.name)
def test_shipped_public_manifests_need_the_stub_model_folder(manifest, tmp_path):
    # As shipped they name no model, so they would post-train nothing real: refused naming model.path;
    # the video DPO one names no clip pairs either (they are the user's), refused naming rl.data, and
    # the world-model one no LeRobot dataset, refused naming rl.data.lerobot.
    # The online world-model ones name no base and no window keys either (rl.init_from, rl.prompts.file).
    found = errors(manifest, [])
    world_nft = ["rl.init_from", "rl.prompts.file"]
    data_keys = {"dpo_t2v_public_8gpu.toml": ["rl.data"], "sft_world_pusht_public_8gpu.toml": ["rl.data.lerobot"],
                 "nft_world_pusht_public_8gpu.toml": world_nft, "nft_world_bridge_public_8gpu.toml": world_nft}.get(manifest.name, [])  # fmt: skip
    assert sorted(found) == sorted(["model.path", *data_keys]) and "no model named" in found["model.path"]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    (tmp_path / "episodes").mkdir()
    folder = stub_model_folder(tmp_path / "nano")
    keys = tmp_path / "keys.txt"
    keys.write_text(f"lerobot window episode=0 start=0 root={tmp_path / 'episodes'}\n")
    given = {"rl.data": f'rl.data.jsonl="{pairs}"', "rl.data.lerobot": f'rl.data.lerobot="{tmp_path / "episodes"}"',
             "rl.init_from": f'rl.init_from="{folder}"', "rl.prompts.file": f'rl.prompts.file="{keys}"'}  # fmt: skip
    assert errors(manifest, [f'model.path="{folder}"', *(given[key] for key in data_keys)]) == {}


NFT_CASES = [
    # (overrides, key that must be named, text in the message)
    (["rl.advantage_low=0.5"], "rl.advantage_low", "the clamp must hold 0"),
    (["rl.advantage_low=-3.0", "rl.advantage_high=-1.0"], "rl.advantage_high", "the clamp must hold 0"),
    (['grid.backend="local"'], "grid.backend", "Ray actor group"),
    (['grid.grouping="per_role"'], "grid.grouping", 'set grid.grouping = "single"'),
    (['grid.gpu_placement="disaggregated"'], "grid.gpu_placement", "colocated"),
    (["grid.gpus_per_role={policy=1}"], "grid.gpus_per_role", "no per-role GPU overrides"),
    (["grid.shapes={policy=[1,4], rollout=[2,2]}"], "grid.shapes.rollout", "(1, group_size)"),
    (["grid.shapes={policy=[1,4]}"], "grid.shapes", "exactly the roles policy and rollout"),
    (["grid.shapes={policy=[1,4], rollout=[1,4]}", "grid.ranks=4"], "grid.shapes", "not both"),
    (["grid.num_replicas=2"], "grid.num_replicas", "one execution replica"),
    (["grid.ranks=3"], "grid.ranks", "must equal rl.group_size (4)"),
    (['rl.modality="video"', "model.num_frames=9"], "rl.profile", 'video NFT takes no profile (a profile fixes T2I production coordinates; a clip\'s frames and size come from [model]) (got "t2i_tiny"); remove rl.profile'),
    (['rl.modality="video"', "model.num_frames=9", 'rl.profile=""', 'rl.init_keys_to_skip_loading=["audio_*"]'], "rl.init_keys_to_skip_loading", "must be empty for video NFT"),
    (['rl.modality="video"', 'rl.profile=""'], "rl.modality", "model.num_frames = 1 makes image"),
    (["model.num_frames=9"], "rl.modality", 'makes video (got "image"); set rl.modality = "video"'),
    (['rl.profile="t2i_huge"'], "rl.profile", '"t2i_tiny", "t2i_public"'),
    (['rl.profile=""'], "rl.profile", "known T2I profile"),
    (["model.image_size=64"], "model.image_size", "fixes the image size at 32"),
    (['rl.init_from=""'], "rl.init_from", "required"),
    (['rl.init_from="preset:huge"'], "rl.init_from", "unknown preset"),
    (['rl.init_from="gs://bucket/x"'], "rl.init_from", "unsupported URL scheme"),
    (['rl.init_from="s3://"'], "rl.init_from", "not a valid s3:// URL"),
    (['rl.init_from="no/such/folder"'], "rl.init_from", "folder not found"),
    (['rl.reward.revision=""'], "rl.reward.revision", "required"),
    (['rl.reward.url="ftp://x"'], "rl.reward.url", "http://"),
    (['rl.reward.name="aesthetic"'], "rl.reward.name", "not a built-in reward"),
    (["rl.reward.timeout_s=0"], "rl.reward.timeout_s", "> 0"),
    (["rl.reward.timeout_s=inf"], "rl.reward.timeout_s", "must be finite and at most 3600 s"),
    (["rl.reward.timeout_s=3601"], "rl.reward.timeout_s", "(got 3601.0)"),
    (["rl.reward.backoff_s=inf"], "rl.reward.backoff_s", "must be finite and at most 600 s"),
    (['rl.reward.token_env="not a name"'], "rl.reward.token_env", "environment variable name"),
    (['rl.reward.frame_reduce="min"'], "rl.reward.frame_reduce", "set for an image run (model.num_frames = 1), where no clip is scored frame by frame"),
    (["rl.reward.frame_stride=2"], "rl.reward.frame_stride", 'set for an image run (model.num_frames = 1), where no clip is scored frame by frame (got 2); remove rl.reward.frame_stride'),
    (['rl.reward.frame_reduce="max"'], "rl.reward.frame_reduce", '"mean", "min", "first", "last"'),
    (['rl.reward.name="shapes_video_strict"'], "rl.reward.name", 'scores whole clips, and this run makes images (model.num_frames = 1) (got "shapes_video_strict"); use "shapes_strict"'),
    (['rl.scheduler="ddim"'], "rl.scheduler", "UniPC"),
    (["model.lora.rank=0"], "model.lora.rank", "second LoRA adapter"),
    (['grid.device="cuda"', "grid.nodes=1", "grid.gpus_per_node=8"], "grid.gpus_per_node", "must equal rl.group_size (4)"),
    (["grid.nodes=2"], "rl.reward.url", "other nodes cannot reach"),
    (["rl.old.update_every=0"], "rl.old.update_every", ">= 1 when rl.old.build_old"),
    (["rl.old.decay_cap=1.0"], "rl.old.decay_cap", "[0, 1)"),
    (["rl.old.flat_steps=-1"], "rl.old.flat_steps", ">= 0"),
    (['grid.ray_address="head-node"'], "grid.ray_address", "is not host:port, ray://host:port or auto"),
    (['grid.ray_address="10.0.0.1:99999"'], "grid.ray_address", "not a number in 1..65535"),
    (["rl.ref.update_every=5"], "rl.ref.update_every", "frozen"),
    (["rl.advantage_low=5.0", "rl.advantage_high=-5.0"], "rl.advantage_low", "below rl.advantage_high"),
    (['rl.r_map="exp"'], "rl.r_map", "unknown option"),
    (["rl.r_tau=0.0"], "rl.r_tau", "> 0"),
    (['rl.rollout_seed_clock="wall"'], "rl.rollout_seed_clock", '"source_row", "optimizer_step"'),
    (["rl.group_size=1", "grid.ranks=1"], "rl.group_size", ">= 2"),
    (["rl.prompts_per_step=0"], "rl.prompts_per_step", ">= 1"),
    (["rl.sample_steps=1"], "rl.sample_steps", ">= 2"),
    (["rl.sampler_shift=0.0"], "rl.sampler_shift", "> 0"),
    (["rl.timesteps_per_sample=9"], "rl.timesteps_per_sample", "rl.sample_steps = 8"),
    (['rl.prompts.file="missing.txt"'], "rl.prompts.file", "file not found"),
    (["model.config.parallelism.data_parallel_shard_degree=3"], "model.config.parallelism.data_parallel_shard_degree", "group_size (4)"),
    (["rl.beta=0.0"], "rl.beta", "> 0"),
    (["rl.max_steps=0"], "rl.max_steps", ">= 1"),
    (["rl.optimizer.lr=0.0"], "rl.optimizer.lr", "> 0"),
    *[([*ONE_OFF, f"rl.rewards=[{t}]"], key, text) for t, key, text in [
        ('{name="", revision="r"}', "rl.rewards[0].name", "required"),
        ('{name="brightness", revision="r"}, {name="brightness", revision="r"}', "rl.rewards[1].name", "listed before"),
        ('{name="brightness", revision="r", weight=0.0}', "rl.rewards[0].weight", "finite number > 0"),
        ('{name="brightness", revision="r", weight=inf}', "rl.rewards[0].weight", "finite number > 0"),
        ('{name="videoalign", revision="r", model="/m", dimensions={vq=1.0, mq=-1.0}}', "rl.rewards[0].dimensions.mq", "finite number > 0"),
        ('{name="j", revision="r", url="http://127.0.0.1:1/v1", judge={model="m"}, dimensions={vq=1.0}}', "rl.rewards[0].dimensions", "no named dimensions"),
        ('{name="brightness"}', "rl.rewards[0].revision", "required"),
        ('{name="brightness", revision="r", url="ftp://x"}', "rl.rewards[0].url", "http://"),
        ('{name="pickscore", revision="r", url="http://127.0.0.1:1", model="m"}', "rl.rewards[0].model", "only for the built-in service"),
        ('{name="pickscore", revision="r"}', "rl.rewards[0].model", "required"),
        ('{name="brightness", revision="r", model="."}', "rl.rewards[0].name", "not a model reward"),
        ('{name="pickscore", revision="r", model="no/such/folder"}', "rl.rewards[0].model", "folder not found"),
        ('{name="hpsv2", revision="r"}', "rl.rewards[0].name", "not a built-in reward"),
        ('{name="brightness", revision="r", timeout_s=0.0}', "rl.rewards[0].timeout_s", "> 0"),
        ('{name="brightness", revision="r", max_retries=-1}', "rl.rewards[0].max_retries", ">= 0"),
        ('{name="brightness", revision="r", backoff_s=-1.0}', "rl.rewards[0].backoff_s", ">= 0"),
        ('{name="brightness", revision="r", timeout_s=inf}', "rl.rewards[0].timeout_s", "must be finite and at most 3600 s"),
        ('{name="brightness", revision="r", backoff_s=1e9}', "rl.rewards[0].backoff_s", "must be finite and at most 600 s"),
        ('{name="brightness", revision="r", token_env="not a name"}', "rl.rewards[0].token_env", "environment variable name"),
        ('{name="shapes_video_partial", revision="r"}', "rl.rewards[0].name", 'scores whole clips, and this run makes images (model.num_frames = 1) (got "shapes_video_partial"); use "shapes_partial"'),
        ('{name="pickscore", revision="r", url="http://127.0.0.1:1", frame_reduce="min"}', "rl.rewards[0].frame_reduce", "set for an image run"),
    ]],
    (['rl.rewards=[{name="brightness", revision="r"}]'], "rl.rewards", "not both"),
    ([*ONE_OFF, 'rl.rewards=[{name="brightness", revision="r"}]', "grid.nodes=2"], "rl.rewards[0].url", "other nodes cannot reach"),
    # [[rl.eval.rewards]]: the same tables, judged by the same rules under their own key.
    *[(["rl.eval.every=1", f"rl.eval.rewards=[{t}]"], key, text) for t, key, text in [
        ('{name="pickscore", revision="r"}', "rl.eval.rewards[0].model", "required"),
        ('{name="pickscore", revision="r", model="no/such/folder"}', "rl.eval.rewards[0].model", "folder not found"),
        ('{name="hpsv2", revision="r"}', "rl.eval.rewards[0].name", "not a built-in reward"),
        ('{name="brightness"}', "rl.eval.rewards[0].revision", "every evaluation pins the revision"),
    ]],
]


VIDEO_NFT = ['rl.modality="video"', "model.num_frames=9", 'rl.profile=""']


def test_video_nft_validates_with_no_profile_and_nothing_skipped():
    """Video NFT (rl.modality = "video", model.num_frames = 4k + 1) is a valid run: no rule refuses
    it as a whole, and an image reward on it scores frame by frame (the shapes image verifier
    against each caption's static part; `validate --data` judges the prompt rows, below)."""
    assert errors(NFT, VIDEO_NFT) == {}
    assert errors(NFT, [*VIDEO_NFT, 'rl.reward.name="shapes_video_partial"']) == {}
    assert errors(NFT, [*VIDEO_NFT, 'rl.reward.name="shapes_partial"']) == {}
    assert errors(NFT, [*VIDEO_NFT, *ONE_OFF, 'rl.rewards=[{name="brightness", revision="r"}, {name="shapes_strict", revision="r"}]']) == {}


def test_validate_data_names_the_prompt_rows_a_per_frame_shapes_reward_cannot_score(tmp_path):
    """The shapes image verifier scores a clip's frames against its caption's static part: a colour
    change (no static part) and an image caption (no motion) are named by file and line; the same
    file is fine for the clip verifier, and the image caption is fine for an image run."""
    from cosmos_rl.config.algorithms import check_data

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moving left\na square turning from red to blue\na red circle\n")
    per_frame = [*VIDEO_NFT, f'rl.prompts.file="{prompts}"', 'rl.reward.name="shapes_partial"']
    found, _ = check_data(load.load(NFT, per_frame), NFT.parent)
    assert [p.path for p in found] == ["rl.prompts.file"] * 2, found
    assert f"{prompts}:2: rl.reward.name = 'shapes_partial'" in found[0].problem and "is a colour change" in found[0].problem
    assert f"{prompts}:3:" in found[1].problem and "is no moving-shapes caption" in found[1].problem
    assert "'shapes_video_partial'" in found[1].problem
    clip_reward = [*VIDEO_NFT, f'rl.prompts.file="{prompts}"', 'rl.reward.name="shapes_video_partial"']
    assert check_data(load.load(NFT, clip_reward), NFT.parent)[0] == []
    prompts.write_text("a red circle\n")
    assert check_data(load.load(NFT, [f'rl.prompts.file="{prompts}"', 'rl.reward.name="shapes_partial"']), NFT.parent)[0] == []


def test_the_frame_keys_of_a_video_run():
    """On a video run an image reward takes frame_reduce / frame_stride and a clip reward is a
    reward; a clip reward scores whole clips, so the frame keys are refused on it."""
    found = errors(NFT, [*VIDEO_NFT, 'rl.reward.frame_reduce="min"', "rl.reward.frame_stride=4"])
    assert "rl.modality" not in found, found
    assert not {"rl.reward.frame_reduce", "rl.reward.frame_stride"} & set(found), found
    assert "must be >= 1 (got 0)" in errors(NFT, [*VIDEO_NFT, "rl.reward.frame_stride=0"])["rl.reward.frame_stride"]
    one_frame = errors(NFT, [*VIDEO_NFT, 'rl.reward.frame_reduce="first"', "rl.reward.frame_stride=2"])["rl.reward.frame_stride"]
    assert 'plays no part with frame_reduce = "first", which scores one frame' in one_frame
    found = errors(NFT, [*VIDEO_NFT, 'rl.reward.name="shapes_video_strict"'])
    assert "rl.reward.name" not in found, found
    found = errors(NFT, [*VIDEO_NFT, *ONE_OFF, 'rl.rewards=[{name="shapes_video_partial", revision="r", frame_stride=2}, {name="brightness", revision="b", frame_reduce="last"}]'])
    assert "plays no part: shapes_video_partial scores whole clips itself, not frame by frame (got 2)" in found["rl.rewards[0].frame_stride"]
    assert not {"rl.rewards[0].name", "rl.rewards[1].frame_reduce"} & set(found), found


# [rl.eval] is the same table for both algorithms: every case runs against both manifests.
EVAL_ON = ["rl.eval.every=1"]
EVAL_CASES = [
    (["rl.eval.every=-1"], "rl.eval.every", ">= 0"),
    (["rl.eval.every=3", "job.log_every=2"], "rl.eval.every", "multiple of job.log_every (2)"),
    ([*EVAL_ON, "rl.eval.seeds=0"], "rl.eval.seeds", ">= 1"),
    ([*EVAL_ON, "rl.eval.per_task=-1"], "rl.eval.per_task", ">= 0"),
    ([*EVAL_ON, "rl.eval.hacking_window=1"], "rl.eval.hacking_window", ">= 2"),
    ([*EVAL_ON, 'rl.eval.gold="nope"'], "rl.eval.gold", "not a reward the evaluation scores in-process"),
    ([*EVAL_ON, 'rl.eval.gold="shapes_strict"'], "rl.eval.gold", "is rl.eval.reward itself"),
    (["rl.eval.stop_on_hacking=true"], "rl.eval.stop_on_hacking", "needs evaluations during training (rl.eval.every is 0)"),
    ([*EVAL_ON, "rl.eval.sample_steps=-1"], "rl.eval.sample_steps", ">= 0"),
    ([*EVAL_ON, "rl.eval.guidance=-0.5"], "rl.eval.guidance", ">= 0"),
    ([*EVAL_ON, 'rl.eval.reward="pickscore"'], "rl.eval.reward", "not a built-in weight-free reward"),
    ([*EVAL_ON, 'rl.eval.prompts="missing.txt"'], "rl.eval.prompts", "file not found"),
]


@pytest.mark.parametrize("manifest", [NFT, DPO], ids=["nft", "dpo"])
@pytest.mark.parametrize("overrides, key, text", EVAL_CASES, ids=[c[1] + ":" + c[0][-1] for c in EVAL_CASES])
def test_eval_rule(manifest, overrides, key, text):
    found = errors(manifest, overrides)
    assert key in found, found
    assert text in found[key]


def test_eval_rule_warnings_and_a_valid_eval_table(tmp_path):
    prompts = tmp_path / "held_out.txt"
    prompts.write_text("a red circle\n")
    assert "never evaluates" in warnings(NFT, ["rl.eval.every=100"])["rl.eval.every"]
    assert "has no effect" in warnings(DPO, ["rl.eval.every=1", f'rl.eval.prompts="{prompts}"', "rl.eval.per_task=3"])["rl.eval.per_task"]
    on = ["rl.eval.every=10", "rl.eval.seeds=1", 'rl.eval.reward="shapes_partial"', f'rl.eval.prompts="{prompts}"']
    assert errors(NFT, on) == {} and errors(DPO, on) == {}
    assert errors(NFT, ["rl.eval.seeds=0"]) == {}  # evaluation off: its other knobs are not judged
    assert errors(NFT, ["rl.eval.every=10", "rl.eval.stop_on_hacking=true", 'rl.eval.gold="shapes_partial"']) == {}
    assert "is a reward the run trains on" in warnings(NFT, ["rl.eval.every=10", 'rl.eval.gold="brightness"'])["rl.eval.gold"]
    # SFT logs no training reward: the watch never warns, so stopping on it is a no-op worth saying
    assert "has no effect" in warnings(SFT, ["rl.eval.every=10", "rl.eval.stop_on_hacking=true"])["rl.eval.stop_on_hacking"]


def test_several_rewards_pass_and_one_reward_form_still_does():
    two = [*ONE_OFF, 'rl.rewards=[{name="brightness", revision="a", weight=2.0}, {name="prompt_colour", revision="b"}]']
    assert errors(NFT, two) == {}
    assert errors(NFT, [*two, 'rl.reward_combine="normalised_sum"']) == {}
    assert errors(NFT, []) == {}


def test_reward_rule_warnings(tmp_path):
    (tmp_path / "clip").mkdir()
    model = f'rl.rewards=[{{name="pickscore", revision="r", model="{tmp_path / "clip"}"}}]'
    assert "not pinned" in warnings(NFT, [*ONE_OFF, model])["rl.rewards[0].reward_revision"]
    hps = model.replace('"pickscore"', '"hps"')  # HPSv2.1 is a model reward of the built-in service like PickScore
    assert "not pinned" in warnings(NFT, [*ONE_OFF, hps])["rl.rewards[0].reward_revision"]
    assert not [k for k in errors(NFT, [*ONE_OFF, hps]) if k.startswith("rl.rewards")]
    assert "has no effect with one reward" in warnings(NFT, ['rl.reward_combine="normalised_sum"'])["rl.reward_combine"]


@pytest.mark.parametrize("overrides, key, text", NFT_CASES, ids=[c[1] + ":" + c[0][-1] for c in NFT_CASES])
def test_nft_rule(overrides, key, text):
    found = errors(NFT, overrides)
    assert key in found, found
    assert text in found[key]


DPO_CASES = [
    (['grid.backend="k8s"'], "grid.backend", '"local", "ray"'),
    (['grid.grouping="per_role"'], "grid.grouping", "per_role needs"),
    (["model.config.parallelism.data_parallel_shard_degree=3"], "model.config.parallelism.data_parallel_shard_degree", "grid.nodes * grid.gpus_per_node"),
    (["rl.validation.data.synthetic_pairs=0"], "rl.validation.data", "explicit held-out source"),
    (["rl.validation.data.synthetic_seed=0"], "rl.validation.data.synthetic_seed", "validation pairs are training pairs"),
    (["rl.beta=0.0"], "rl.beta", "> 0"),
    (["rl.optimizer.lr=-1e-3"], "rl.optimizer.lr", "> 0"),
    (["rl.pairs_per_step=0"], "rl.pairs_per_step", ">= 1"),
    (["rl.pairs_per_step=7"], "rl.pairs_per_step", "split evenly over the 2 ranks"),
    (["rl.max_steps=0"], "rl.max_steps", ">= 1"),
    (["checkpoint.every=-1"], "checkpoint.every", ">= 0"),
    (["job.log_every=0"], "job.log_every", ">= 1"),
    (["rl.data.synthetic_pairs=0"], "rl.data", "no preference data source"),
    (["rl.data.synthetic_pairs=0", 'rl.data.jsonl="nope.jsonl"'], "rl.data.jsonl", "file not found"),
    (["rl.data.synthetic_pairs=0", 'rl.data.shards=["nope.tar"]'], "rl.data.shards[0]", "file not found"),
    (["rl.data.synthetic_pairs=0", 'rl.data.factory="no_colon"'], "rl.data.factory", "module:function"),
    (["rl.data.synthetic_pairs=0", 'rl.data.factory="no_such_module_xyz:f"'], "rl.data.factory", "cannot import"),
    (["rl.data.synthetic_pairs=0", 'rl.data.factory="json:no_such_function"'], "rl.data.factory", "has no function"),
    (["rl.data.synthetic_pairs=0", 'rl.data.jsonl="a"', 'rl.data.shards=["b"]'], "rl.data", "more than one data source"),
    (['grid.shapes={policy=[1,2]}'], "grid.shapes", "NFT role-shape setting"),
    (["grid.nodes=2", "model.config.parallelism.data_parallel_shard_degree=4"], "grid.rdzv_endpoint", "rendezvous endpoint"),
    (["model.image_size=20"], "model.image_size", "multiple of 16"),
    (['model.path="no/such/model"'], "model.path", "folder not found"),
    (['rl.init_keys_to_skip_loading=["audio_*"]'], "rl.init_keys_to_skip_loading", "no checkpoint is loaded"),
    (["model.lora.rank=-1"], "model.lora.rank", ">= 0"),
    (["rl.optimizer.betas=[0.9]"], "rl.optimizer.betas", "two numbers"),
    (['job.name="../escape"'], "job.name", "plain folder name"),
    (['job.wandb_entity="team"'], "job.wandb_entity", "without job.wandb_project"),
    (["grid.timeout_s=inf"], "grid.timeout_s", "must be finite and at most 604800 s"),
    (["grid.timeout_s=1e308"], "grid.timeout_s", "must be finite and at most 604800 s"),
    (["grid.timeout_s=604801"], "grid.timeout_s", "(got 604801.0)"),
    (["job.seed=18446744073709551616"], "job.seed", "a non-negative 64-bit integer"),
    (["job.seed=-1"], "job.seed", "must be in [0, 2**63 - 1]"),
    (["rl.data.synthetic_seed=9223372036854775808"], "rl.data.synthetic_seed", "must be in [0, 2**63 - 1]"),
]


SFT = ROOT / "manifests" / "sft_shapes_cpu.toml"
SFT_CASES = [
    (['grid.backend="ray"', 'grid.grouping="per_role"'], "grid.grouping", "SFT has no data role to place apart"),
    (['grid.gpu_placement="disaggregated"'], "grid.gpu_placement", "SFT runs its roles colocated"),
    (["grid.ranks=2"], "grid.ranks", "SFT's width is"),
    (["model.config.parallelism.data_parallel_shard_degree=2"], "model.config.parallelism.data_parallel_shard_degree", "grid.nodes * grid.gpus_per_node"),
    (["rl.samples_per_step=0"], "rl.samples_per_step", ">= 1"),
    (["grid.gpus_per_node=2", "model.config.parallelism.data_parallel_shard_degree=2", "rl.samples_per_step=7"], "rl.samples_per_step", "split evenly over the 2 ranks"),
    (["rl.caption_dropout=1.0"], "rl.caption_dropout", "[0, 1)"),
    (["rl.caption_dropout=-0.1"], "rl.caption_dropout", "[0, 1)"),
    (['rl.train="vae"', "model.lora.rank=8"], "model.lora.rank", "LoRA adapts the transformer only"),
    (["rl.data.shards=[]"], "rl.data", "no image-caption data source"),
    (['rl.data.jsonl="a.jsonl"'], "rl.data", "more than one data source"),
    (["rl.data.shards=[]", 'rl.data.jsonl="nope.jsonl"'], "rl.data.jsonl", "file not found"),
    (['rl.data.shards=["nope.tar"]'], "rl.data.shards[0]", "file not found"),
    (['rl.train="text"'], "rl.train", '"transformer", "vae"'),
    (['rl.init_from="preset:huge"'], "rl.init_from", "preset:shapes"),
    (["rl.optimizer.lr=0.0"], "rl.optimizer.lr", "> 0"),
]


@pytest.mark.parametrize("overrides, key, text", SFT_CASES, ids=[c[1] + ":" + c[0][-1] for c in SFT_CASES])
def test_sft_rule(overrides, key, text):
    found = errors(SFT, overrides)
    assert key in found, found
    assert text in found[key]


def test_sft_vae_mode_and_the_shapes_preset_pass(shipped_manifests):
    sft = shipped_manifests / SFT.name
    assert errors(sft, ['rl.train="vae"']) == {}
    assert errors(sft, ['model.preset="tiny"', 'rl.init_from="preset:shapes"']) == {}


@pytest.mark.parametrize("overrides, key, text", DPO_CASES, ids=[c[1] + ":" + c[0][-1] for c in DPO_CASES])
def test_dpo_rule(overrides, key, text, monkeypatch):
    monkeypatch.delenv(preflight.RDZV_ENV, raising=False)
    found = errors(DPO, overrides)
    assert key in found, found
    assert text in found[key]


def test_the_largest_timeout_and_seed_pass():
    assert errors(DPO, [f"grid.timeout_s={preflight.GRID_TIMEOUT_MAX_S}", f"job.seed={2**63 - 1}"]) == {}

# Rules between model.path, model.preset and rl.init_from, on real folders: {folder} is a pipeline
# folder (model_index.json), {other} a second one, {weights} a weights-only folder.
MODEL_CASES = [
    (DPO, ['model.path="{folder}"'], "model.preset", "given together with model.path"),
    (NFT, ['model.path="{folder}"'], "rl.init_from", "names a built-in preset's random weights while model.path names a folder"),
    (DPO, ['rl.init_from="{folder}"'], "rl.init_from", 'pipeline folder, which brings its own architecture, VAE, tokenizer and scheduler, but the model is model.preset = "tiny"'),
    (NFT, ['model.path="{folder}"', 'rl.init_from="{other}"'], "rl.init_from", "but model.path is"),
]


def _layouts(tmp_path: Path) -> dict[str, str]:
    weights = tmp_path / "weights" / "transformer"
    weights.mkdir(parents=True)
    (weights / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    return {"folder": str(stub_model_folder(tmp_path / "a")), "other": str(stub_model_folder(tmp_path / "b")), "weights": str(weights.parent)}


@pytest.mark.parametrize("manifest, overrides, key, text", MODEL_CASES, ids=[f"{m.stem}:{k}:{o[-1]}" for m, o, k, _ in MODEL_CASES])
def test_model_and_base_rule(tmp_path, manifest, overrides, key, text):
    paths = _layouts(tmp_path)
    found = errors(manifest, [o.format(**paths) for o in overrides])
    assert key in found, found
    assert text in found[key]


@pytest.mark.parametrize("init_from", ["{folder}", "{weights}", "{folder}/transformer", "s3://bases/nano"])
def test_a_folder_model_takes_itself_a_weights_folder_or_s3_as_its_base(tmp_path, init_from):
    paths = _layouts(tmp_path)
    public = ROOT / "manifests" / "nft_t2i_public_4gpu.toml"
    assert errors(public, [f'model.path="{paths["folder"]}"', f'rl.init_from="{init_from.format(**paths)}"']) == {}


def test_the_same_folder_spelled_relative_and_absolute_is_not_a_contradiction(tmp_path):
    manifest = tmp_path / "run.toml"
    manifest.write_text((ROOT / "manifests" / "dpo_t2i_public_4gpu.toml").read_text())
    stub_model_folder(tmp_path / "nano")
    assert errors(manifest, ['model.path="nano"', f'rl.init_from="{tmp_path / "nano"}"']) == {}


@pytest.mark.parametrize(
    "scheduler, text",
    [
        (None, "has no scheduler/scheduler_config.json"),
        ({"_class_name": "FlowMatchEulerDiscreteScheduler"}, "scheduler/scheduler_config.json is a FlowMatchEulerDiscreteScheduler"),
        ({"use_flow_sigmas": False}, "scheduler/scheduler_config.json is not in flow mode"),
    ],
)
def test_model_path_needs_a_flow_unipc_scheduler(tmp_path, scheduler, text):
    folder = stub_model_folder(tmp_path / "nano", **(scheduler or {}))
    if scheduler is None:
        (folder / "scheduler" / "scheduler_config.json").unlink()
    found = errors(ROOT / "manifests" / "dpo_t2i_public_4gpu.toml", [f'model.path="{folder}"'])
    assert text in found["model.path"]


MACHINE_CASES = [
    # (manifest, overrides, visible GPUs, environment, key that must be named or None, text)
    ("dpo_t2i_public_4gpu.toml", [], 0, {}, "grid.device", "this machine has 0 visible CUDA GPU(s)"),
    ("dpo_t2i_public_4gpu.toml", [], 2, {}, "grid.device", '"cuda" with grid.gpus_per_node = 4'),
    ("nft_t2i_public_4gpu.toml", [], 0, {}, "grid.device", "visible CUDA GPU(s)"),
    ("dpo_t2i_public_4gpu.toml", ['grid.device="auto"'], 0, {}, None, ""),  # bfloat16 runs on the CPU too (slowly)
    ("dpo_t2i_public_4gpu.toml", ['grid.device="cpu"'], 0, {}, None, ""),
    ("dpo_t2i_public_4gpu.toml", [], 4, {}, None, ""),
    ("nft_t2i_public_4gpu.toml", ['grid.ray_address="head:6379"'], 0, {}, None, ""),  # the GPUs are the cluster's
    ("nft_t2i_public_4gpu.toml", [], 0, {"RAY_ADDRESS": "head:6379"}, None, ""),
    ("dpo_t2i_smoke.toml", [], 0, {}, None, ""),
    ("nft_t2v_public_8gpu.toml", [], 4, {}, "grid.device", '"cuda" with grid.gpus_per_node = 8'),
    ("nft_t2v_public_8gpu.toml", [], 8, {}, None, ""),
    ("dpo_t2v_public_8gpu.toml", [], 0, {}, "grid.device", "this machine has 0 visible CUDA GPU(s)"),
    ("dpo_t2v_public_8gpu.toml", [], 8, {}, None, ""),
]


@pytest.mark.parametrize("manifest, overrides, gpus, env, key, text", MACHINE_CASES)
def test_machine_rule(manifest, overrides, gpus, env, key, text, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = load.load(ROOT / "manifests" / manifest, ['model.preset="tiny"', *overrides])
    found = {p.path: p.render() for p in preflight.machine_problems(config, gpus)}
    if key is None:
        assert found == {}
    else:
        assert text in found[key], found


def test_model_path_must_be_a_diffusers_folder(tmp_path):
    found = errors(DPO, [f'model.path="{tmp_path}"'])
    assert "not a diffusers folder" in found["model.path"]


def test_multinode_endpoint_from_the_environment_is_enough(monkeypatch):
    monkeypatch.setenv(preflight.RDZV_ENV, "127.0.0.1:29400")
    assert "grid.rdzv_endpoint" not in errors(DPO, ["grid.nodes=2", "model.config.parallelism.data_parallel_shard_degree=4"])


def test_synthetic_next_to_a_file_source_warns(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("")
    found = warnings(DPO, [f'rl.data.jsonl="{data}"'])
    assert "rl.data.synthetic_pairs" in found and "rl.data.jsonl is ignored" in found["rl.data.synthetic_pairs"]
    assert errors(DPO, [f'rl.data.jsonl="{data}"']) == {}


def _factory_module(tmp_path, monkeypatch, with_membership: bool):
    body = "class Source:\n    def __len__(self): return 0\n    def __getitem__(self, i): raise IndexError\n"
    if with_membership:
        body += "    def membership_ids(self): return []\n"
    body += "def make() -> Source:\n    return Source()\n"
    (tmp_path / "my_pairs_mod.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    import sys

    sys.modules.pop("my_pairs_mod", None)


def test_factory_with_validation_needs_membership_ids(tmp_path, monkeypatch):
    _factory_module(tmp_path, monkeypatch, with_membership=False)
    found = errors(DPO, ["rl.validation.data.synthetic_pairs=0", 'rl.validation.data.factory="my_pairs_mod:make"'])
    assert "membership_ids()" in found["rl.validation.data.factory"]


def test_factory_with_membership_ids_passes(tmp_path, monkeypatch):
    _factory_module(tmp_path, monkeypatch, with_membership=True)
    assert errors(DPO, ["rl.validation.data.synthetic_pairs=0", 'rl.validation.data.factory="my_pairs_mod:make"']) == {}


GRPO_CASES = [
    # (overrides, key that must be named, text in the message)
    (['rl.scheduler="unipc"'], "rl.scheduler", "GRPO rolls out with a stochastic sampler"),
    (['rl.scheduler="cps"', "rl.noise_level=1.5"], "rl.noise_level", "eta in (0, 1]"),
    (["rl.old.build_old=true"], "rl.old.build_old", "GRPO keeps no moving old policy"),
    (["rl.noise_level=0.0"], "rl.noise_level", "> 0"),
    (["rl.clip_range=0.0"], "rl.clip_range", "> 0"),
    (["rl.kl_beta=-0.1"], "rl.kl_beta", ">= 0"),
    (["rl.advantage_clip=0.0"], "rl.advantage_clip", "> 0"),
    (["rl.sde_window=-1"], "rl.sde_window", "0 (plain Flow-GRPO)"),
    (["rl.sde_window=10", "rl.sde_window_range=[]"], "rl.sde_window", "longer than the 9 steps of rl.sample_steps = 10"),
    (["rl.sde_window_range=[0, 2]"], "rl.sde_window_range", "room for rl.sde_window = 3 steps"),
    (["rl.sde_window_range=[0, 10]"], "rl.sde_window_range", "hi <= 9"),
    (["rl.sde_window_range=[0, 2, 4]"], "rl.sde_window_range", "must be [lo, hi]"),
    ([*PLAIN, "rl.timestep_fraction=1.0"], "rl.timestep_fraction", "floor(1 x 10) = 10 of the rl.sample_steps = 10"),
    ([*PLAIN, "rl.timestep_fraction=0.05"], "rl.timestep_fraction", "between 1 and 9"),
    ([*PLAIN, "rl.timestep_fraction=0.0"], "rl.timestep_fraction", "must be in (0, 1]"),
    ([*PLAIN, "rl.timestep_fraction=nan"], "rl.timestep_fraction", "must be in (0, 1]"),
    # NFT's topology and reward rules, naming GRPO
    (['grid.backend="local"'], "grid.backend", "GRPO's five roles are one Ray actor group"),
    (["grid.shapes={policy=[1,4], rollout=[2,2]}"], "grid.shapes.rollout", "GRPO needs (1, group_size) = (1, 4)"),
    (["grid.num_replicas=2"], "grid.num_replicas", "GRPO runs one execution replica"),
    (['rl.reward.revision=""'], "rl.reward.revision", "required"),
    (["rl.sample_steps=1"], "rl.sample_steps", ">= 2"),
    # clips: a conditioned rollout's frames come from a prompt row's image or a suite, never "data"
    (["model.num_frames=9", 'model.condition.kind="first_frame"', 'model.condition.source="data"'], "model.condition.source",
     "an online run generates its clips"),
]


@pytest.mark.parametrize("overrides, key, text", GRPO_CASES, ids=[c[1] + ":" + c[0][-1] for c in GRPO_CASES])
def test_grpo_rule(overrides, key, text):
    found = errors(GRPO, overrides)
    assert key in found, found
    assert text in found[key]


def test_grpo_plain_and_fast_pass_and_warn_of_knobs_the_other_variant_ignores():
    assert errors(GRPO, []) == {} and errors(GRPO, PLAIN) == {}
    assert errors(GRPO, [*PLAIN, "rl.timestep_fraction=0.5", "rl.guidance=4.5", "rl.kl_beta=0.0"]) == {}
    assert "has no effect with Flow-GRPO-Fast" in warnings(GRPO, ["rl.timestep_fraction=0.5"])["rl.timestep_fraction"]
    assert "has no effect with plain Flow-GRPO" in warnings(GRPO, ["rl.sde_window=0"])["rl.sde_window_range"]
    # the coefficients-preserving step: any eta in (0, 1]; over every step it narrows the samples
    assert errors(GRPO, ['rl.scheduler="cps"', "rl.noise_level=0.8"]) == {}
    assert warnings(GRPO, ['rl.scheduler="cps"', "rl.noise_level=1.0"]) == {}
    assert "narrows the samples" in warnings(GRPO, [*PLAIN, 'rl.scheduler="cps"'])["rl.scheduler"]
    # NFT's own keys are not GRPO's
    assert "belongs to NFT" in errors(GRPO, ['rl.profile="t2i_tiny"'])["rl.profile"]


def test_nft_shapes_from_num_replicas_and_ranks():
    config = load.load(NFT, ["grid.num_replicas=1", "grid.ranks=4"])
    shapes, bad = preflight.nft_shapes(config)
    assert bad == [] and shapes == {"policy": [1, 4], "rollout": [1, 4]}


def test_several_rule_violations_are_all_reported():
    found = errors(NFT, ['grid.backend="local"', "rl.r_tau=0.0", 'rl.reward.revision=""', "rl.ref.update_every=1"])
    assert {"grid.backend", "rl.r_tau", "rl.reward.revision", "rl.ref.update_every"} <= set(found)


def test_wandb_project_needs_the_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    found = errors(DPO, ['job.wandb_project="proj"'])
    assert "the wandb package is not installed" in found["job.wandb_project"]


FRAME_CASES = [
    # (overrides, key, text): the frame rules hold for every algorithm (here on SFT's shapes manifest)
    (["model.num_frames=8"], "model.num_frames", "4k + 1 frames (got 8); use 5 or 9"),
    (["model.num_frames=2"], "model.num_frames", "use 5"),
    (["model.num_frames=0"], "model.num_frames", "must be >= 1"),
    (["model.fps=0"], "model.fps", "positive, finite"),
    (["model.fps=30"], "model.fps", "plays no part"),
]


@pytest.mark.parametrize("overrides, key, text", FRAME_CASES, ids=[c[0][0] for c in FRAME_CASES])
def test_frame_rule(overrides, key, text):
    found = errors(SFT, overrides)
    assert key in found, found
    assert text in found[key]


def test_video_frames_at_any_frame_rate_pass():
    found = errors(SFT, ["model.num_frames=9", "model.fps=16", *FIRST_FRAME_FROM_DATA, "model.condition.probability=0.5"])
    assert not {"model.num_frames", "model.fps", "model.condition.kind", "model.condition.probability"} & set(found), found


def test_an_algorithm_that_trains_no_video_refuses_clips():
    """Every built-in algorithm trains clips; an entry that does not (the stand-in, tests/standin_algorithms.py) is refused them."""
    raw = {"model": {"preset": "tiny", "num_frames": 9}, "rl": {"algorithm": "standin_algorithms:RANKS", "samples_per_step": 4, "max_steps": 3}}
    found = {p.path: p.render() for p in preflight.check(load.structure(raw)) if p.severity == "error"}
    assert 'rl.algorithm = "standin_algorithms:RANKS" does not train video in this release' in found["model.num_frames"]
    assert 'train video with rl.algorithm = "dpo", "nft", "sft", "grpo"' in found["model.num_frames"]


def test_grpo_trains_clips_from_text_and_from_a_first_frame():
    clips = ["model.preset=\"shapes_video\"", 'rl.init_from="preset:shapes_video"', "model.num_frames=9",
             'rl.reward.name="shapes_video_partial"', 'rl.prompts.file="shapes_video_train.txt"', 'rl.eval.reward="shapes_video_strict"']
    assert errors(GRPO, clips) == {}
    i2v = [*clips, 'model.condition.kind="first_frame"', 'model.condition.source="shapes_video"', 'rl.reward.name="shapes_video_i2v_partial"']
    assert errors(GRPO, i2v) == {}


def test_dpo_trains_clip_pairs():
    assert "model.num_frames" not in errors(DPO, ["model.num_frames=9", "model.fps=16"])
    assert "4k + 1 frames (got 8)" in errors(DPO, ["model.num_frames=8"])["model.num_frames"]


FIRST_FRAME_FROM_DATA = ['model.condition.kind="first_frame"', 'model.condition.source="data"']


def test_first_frame_conditioning_needs_clips_through_the_transformer():
    assert "this run makes images" in errors(SFT, FIRST_FRAME_FROM_DATA)["model.condition.kind"]
    assert "must be in [0, 1]" in errors(SFT, ["model.num_frames=9", *FIRST_FRAME_FROM_DATA, "model.condition.probability=2"])["model.condition.probability"]
    assert "trains no clips" in errors(SFT, ["model.num_frames=9", *FIRST_FRAME_FROM_DATA, 'rl.train="vae"', "model.lora.rank=0"])["model.condition.kind"]
    # SFT's given frames are its own clips'; DPO takes no condition; a source needs a kind
    assert "own leading frames" in errors(SFT, ["model.num_frames=9", 'model.condition.kind="first_frame"', 'model.condition.source="image"'])["model.condition.source"]
    assert "takes no condition" in errors(DPO, ["model.num_frames=9", *FIRST_FRAME_FROM_DATA])["model.condition.kind"]
    assert "model.condition.kind gives none" in errors(SFT, ['model.condition.source="data"'])["model.condition.source"]


def test_pixel_weights_are_the_vae_stages_and_name_a_suites_classes():
    vae = ['rl.train="vae"', "model.lora.rank=0"]
    assert not {k for k in errors(SFT, [*vae, 'rl.pixel_weights.suite="pusht"', "rl.pixel_weights.classes={agent = 30}",
                                        "rl.pixel_weights.miss=100"]) if "pixel" in k}  # fmt: skip
    assert "trains the transformer" in errors(SFT, ['rl.pixel_weights.suite="pusht"', "rl.pixel_weights.miss=100"])["rl.pixel_weights"]
    got = errors(SFT, [*vae, 'rl.pixel_weights.suite="pusht"', "rl.pixel_weights.classes={disc = 30}", "rl.pixel_weights.miss=0.5"])
    assert "no pixel class of the suite 'pusht'" in got["rl.pixel_weights.classes.disc"] and "agent, block" in got["rl.pixel_weights.classes.disc"]
    assert "at least 1" in got["rl.pixel_weights.miss"]
    assert "needs a suite's pixel classes" in errors(SFT, [*vae, "rl.pixel_weights.miss=100"])["rl.pixel_weights.suite"]
    assert "classes no pixels" in errors(SFT, [*vae, 'rl.pixel_weights.suite="shapes"', "rl.pixel_weights.miss=100"])["rl.pixel_weights.suite"]
    assert "weighs anything" in errors(SFT, [*vae, 'rl.pixel_weights.suite="pusht"'])["rl.pixel_weights.suite"]


def test_foreground_weight_is_the_vae_stages_and_at_least_one():
    assert not {"rl.foreground_weight"} & set(errors(SFT, ['rl.train="vae"', "model.lora.rank=0", "rl.foreground_weight=10"]))
    assert "trains the transformer" in errors(SFT, ["rl.foreground_weight=10"])["rl.foreground_weight"]
    assert "at least 1" in errors(SFT, ['rl.train="vae"', "model.lora.rank=0", "rl.foreground_weight=0.5"])["rl.foreground_weight"]


def test_the_unclamped_loss_is_the_vae_stages():
    assert not {"rl.unclamped_loss"} & set(errors(SFT, ['rl.train="vae"', "model.lora.rank=0", "rl.unclamped_loss=true"]))
    assert "trains the transformer" in errors(SFT, ["rl.unclamped_loss=true"])["rl.unclamped_loss"]


def _folder_with_vae(root: Path, **vae) -> Path:
    import json

    folder = stub_model_folder(root)
    (folder / "vae").mkdir(exist_ok=True)
    (folder / "vae" / "config.json").write_text(json.dumps(vae))
    return folder


@pytest.mark.parametrize("declared, problem", [(4, None), (1, "declares scale_factor_temporal = 1"), (2, "compress time 4x")])
def test_a_folder_vae_must_declare_the_time_compression_its_network_does(tmp_path, declared, problem):
    # dim_mult [1, 1, 1]: two downsampling stages, both temporal -> 4x in time, 4x in space.
    folder = _folder_with_vae(tmp_path / "nano", dim_mult=[1, 1, 1], temperal_downsample=[True, True],
                              patch_size=None, scale_factor_temporal=declared)  # fmt: skip
    found = errors(DPO_PUBLIC, [f'model.path="{folder}"', "model.num_frames=9"])
    if problem is None:
        assert "model.path" not in found, found
    else:
        assert problem in found["model.path"] and "set scale_factor_temporal = 4" in found["model.path"]
    # An image run never reads the temporal factor.
    assert "model.path" not in errors(DPO_PUBLIC, [f'model.path="{folder}"'])


def test_a_frame_size_off_the_vae_latent_cell_is_refused(tmp_path):
    # 4 downsampling stages x patchify 2: a 32-pixel latent cell, so 48 (a multiple of 16) is refused.
    folder = _folder_with_vae(tmp_path / "nano", dim_mult=[1, 1, 1, 1, 1], temperal_downsample=[False, False, True, True],
                              patch_size=2, scale_factor_temporal=4)  # fmt: skip
    found = errors(DPO_PUBLIC, [f'model.path="{folder}"', "model.image_size=48"])
    assert "32-pixel latent cell" in found["model.image_size"], found
    assert "model.image_size" not in errors(DPO_PUBLIC, [f'model.path="{folder}"', "model.image_size=64"])


def test_a_video_runs_evaluation_scores_clips():
    found = errors(SFT, ["model.num_frames=9", "rl.eval.every=10"])
    assert "scores clips with the moving-shapes verifier" in found["rl.eval.reward"], found
    assert "rl.eval.reward" not in errors(SFT, ["model.num_frames=9", "rl.eval.every=10", 'rl.eval.reward="shapes_video_strict"'])


@pytest.mark.parametrize(
    "overrides, key, text",
    [
        (["rl.optimizer.decay_steps=200"], "rl.optimizer.decay_steps", 'rl.optimizer.decay is "none"'),
        (["rl.optimizer.min_lr_ratio=0.1"], "rl.optimizer.min_lr_ratio", 'rl.optimizer.decay is "none"'),
        (['rl.optimizer.decay="cosine"'], "rl.optimizer.decay_steps", "greater than rl.optimizer.warmup_steps = 0"),
        (['rl.optimizer.decay="linear"', "rl.optimizer.warmup_steps=10", "rl.optimizer.decay_steps=10"], "rl.optimizer.decay_steps", "(got 10)"),
        (['rl.optimizer.decay="linear"', "rl.optimizer.decay_steps=10", "rl.optimizer.min_lr_ratio=1.5"], "rl.optimizer.min_lr_ratio", "[0, 1]"),
        (['rl.optimizer.decay="step"'], "rl.optimizer.decay", '"none", "linear", "cosine"'),
    ],
)
def test_lr_decay_rule(overrides, key, text):
    found = errors(DPO, overrides)
    assert key in found, found
    assert text in found[key]


def test_an_lr_decay_that_outlasts_the_run_warns_where_the_run_stops_on_it(shipped_manifests):
    grpo = shipped_manifests / GRPO.name  # 200 steps, one optimizer step each
    assert errors(grpo, ['rl.optimizer.decay="linear"', "rl.optimizer.decay_steps=200"]) == {}
    assert "rl.optimizer.decay_steps" not in warnings(grpo, ['rl.optimizer.decay="linear"', "rl.optimizer.decay_steps=200"])
    found = warnings(grpo, ['rl.optimizer.decay="linear"', "rl.optimizer.decay_steps=400"])
    # The last of 200 steps (k = 199) runs at 1 - 199/400 = 0.5025 x lr.
    assert "ends after the run's 200 optimizer steps" in found["rl.optimizer.decay_steps"]
    assert "0.502 x lr" in found["rl.optimizer.decay_steps"]
    # GRPO counts rl.updates_per_step optimizer steps a run step: 400 of them here, so no warning.
    assert "rl.optimizer.decay_steps" not in warnings(
        grpo, ['rl.optimizer.decay="linear"', "rl.optimizer.decay_steps=400", "rl.updates_per_step=2"])


def test_the_audit_warnings_and_the_span_map():
    # the span map takes a clamp that does not hold 0; per_side (the default) an asymmetric one
    assert errors(NFT, ["rl.advantage_low=0.5", 'rl.linear_map="span"']) == {}
    assert errors(NFT, ["rl.advantage_low=-1.0"]) == {}
    # guided NFT rollouts: the smoke manifest samples CFG-free and does not warn
    assert "rl.guidance" not in warnings(NFT, [])
    assert "implicit-policy argument" in warnings(NFT, ["rl.guidance=3.0"])["rl.guidance"]
    assert "implicit-policy argument" in warnings(NFT, ["rl.guidance=0.0"])["rl.guidance"]
    # one prompt a step: the batch std is the group std (NFT's default scope; GRPO's when asked)
    assert "rl.advantage_std_scope" not in warnings(NFT, [])  # 2 prompts a step
    assert "is the group std" in warnings(NFT, ["rl.prompts_per_step=1"])["rl.advantage_std_scope"]
    assert "rl.advantage_std_scope" not in warnings(NFT, ["rl.prompts_per_step=1", 'rl.advantage_std_scope="group"'])
    assert "is the group std" in warnings(GRPO, ["rl.prompts_per_step=1"])["rl.advantage_std_scope"]  # its manifest: batch
    assert "rl.advantage_std_scope" not in warnings(GRPO, [])  # 32 prompts a step
