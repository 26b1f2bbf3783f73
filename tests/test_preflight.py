"""Every preflight rule of the specs, each with a broken variant that must name its key."""

from pathlib import Path

import pytest

from cosmos_rl.config import load, preflight

ROOT = Path(__file__).resolve().parent.parent
NFT = ROOT / "manifests" / "nft_t2i_smoke.toml"
DPO = ROOT / "manifests" / "dpo_t2i_smoke.toml"


def errors(manifest: Path, overrides: list[str]) -> dict[str, str]:
    config, problems = load.load_all_problems(manifest, overrides)
    return {p.path: p.render() for p in problems if p.severity == "error"}


def warnings(manifest: Path, overrides: list[str]) -> dict[str, str]:
    _, problems = load.load_all_problems(manifest, overrides)
    return {p.path: p.render() for p in problems if p.severity == "warning"}


@pytest.mark.parametrize("manifest", sorted((ROOT / "manifests").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_manifests_pass_preflight(manifest):
    assert errors(manifest, []) == {}


ONE_OFF = ["rl.reward={}"]  # the smoke manifest's [rl.reward] set back to defaults: "not given"

NFT_CASES = [
    # (overrides, key that must be named, text in the message)
    (['grid.backend="local"'], "grid.backend", "Ray actor group"),
    (['grid.grouping="per_role"'], "grid.grouping", 'set grid.grouping = "single"'),
    (['grid.gpu_placement="disaggregated"'], "grid.gpu_placement", "colocated"),
    (["grid.gpus_per_role={policy=1}"], "grid.gpus_per_role", "no per-role GPU overrides"),
    (["grid.shapes={policy=[1,4], rollout=[2,2]}"], "grid.shapes.rollout", "(1, group_size)"),
    (["grid.shapes={policy=[1,4]}"], "grid.shapes", "exactly the roles policy and rollout"),
    (["grid.shapes={policy=[1,4], rollout=[1,4]}", "grid.ranks=4"], "grid.shapes", "not both"),
    (["grid.num_replicas=2"], "grid.num_replicas", "one execution replica"),
    (["grid.ranks=3"], "grid.ranks", "must equal rl.group_size (4)"),
    (['rl.modality="video"', 'rl.profile=""'], "rl.modality", "not included in this release"),
    (['rl.modality="video"'], "rl.profile", "video NFT takes no profile"),
    (['rl.modality="video"', 'rl.profile=""', 'rl.init_keys_to_skip_loading=["audio_*"]'], "rl.init_keys_to_skip_loading", "requires it to be empty"),
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
    (['rl.reward.token_env="not a name"'], "rl.reward.token_env", "environment variable name"),
    (['rl.scheduler="ddim"'], "rl.scheduler", "UniPC"),
    (["model.lora.rank=0"], "model.lora.rank", "second LoRA adapter"),
    (['grid.device="cuda"', "grid.nodes=1", "grid.gpus_per_node=8"], "grid.gpus_per_node", "must equal rl.group_size (4)"),
    (["grid.nodes=2"], "rl.reward.url", "other nodes cannot reach"),
    (["rl.old.update_every=0"], "rl.old.update_every", ">= 1 when rl.old.build_old"),
    (["rl.old.decay_cap=1.0"], "rl.old.decay_cap", "[0, 1)"),
    (["rl.ref.update_every=5"], "rl.ref.update_every", "frozen"),
    (["rl.advantage_low=5.0", "rl.advantage_high=-5.0"], "rl.advantage_low", "below rl.advantage_high"),
    (['rl.r_map="exp"'], "rl.r_map", "unknown option"),
    (["rl.r_tau=0.0"], "rl.r_tau", "> 0"),
    (['rl.rollout_seed_clock="wall"'], "rl.rollout_seed_clock", '"source_row", "optimizer_step"'),
    (["rl.group_size=1", "grid.ranks=1"], "rl.group_size", ">= 2"),
    (["rl.prompts_per_step=0"], "rl.prompts_per_step", ">= 1"),
    (["rl.sample_steps=1"], "rl.sample_steps", ">= 2"),
    (["rl.timesteps_per_sample=8"], "rl.timesteps_per_sample", "rl.sample_steps - 1"),
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
        ('{name="brightness", revision="r", token_env="not a name"}', "rl.rewards[0].token_env", "environment variable name"),
    ]],
    (['rl.rewards=[{name="brightness", revision="r"}]'], "rl.rewards", "not both"),
    ([*ONE_OFF, 'rl.rewards=[{name="brightness", revision="r"}]', "grid.nodes=2"], "rl.rewards[0].url", "other nodes cannot reach"),
]


def test_several_rewards_pass_and_one_reward_form_still_does():
    two = [*ONE_OFF, 'rl.rewards=[{name="brightness", revision="a", weight=2.0}, {name="prompt_colour", revision="b"}]']
    assert errors(NFT, two) == {}
    assert errors(NFT, [*two, 'rl.reward_combine="normalised_sum"']) == {}
    assert errors(NFT, []) == {}


def test_reward_rule_warnings(tmp_path):
    (tmp_path / "clip").mkdir()
    model = f'rl.rewards=[{{name="pickscore", revision="r", model="{tmp_path / "clip"}"}}]'
    assert "not pinned" in warnings(NFT, [*ONE_OFF, model])["rl.rewards[0].reward_revision"]
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
    (['model.dtype="bfloat16"'], "model.dtype", "needs a GPU"),
    (["model.image_size=20"], "model.image_size", "multiple of 16"),
    (['model.path="no/such/model"'], "model.path", "folder not found"),
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
    (['grid.backend="ray"'], "grid.backend", "SFT runs under torchrun only"),
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


def test_sft_vae_mode_and_the_shapes_preset_pass():
    assert errors(SFT, ['rl.train="vae"']) == {}
    assert errors(SFT, ['model.preset="tiny"', 'rl.init_from="preset:shapes"']) == {}


@pytest.mark.parametrize("overrides, key, text", DPO_CASES, ids=[c[1] + ":" + c[0][-1] for c in DPO_CASES])
def test_dpo_rule(overrides, key, text, monkeypatch):
    monkeypatch.delenv(preflight.RDZV_ENV, raising=False)
    found = errors(DPO, overrides)
    assert key in found, found
    assert text in found[key]


def test_the_largest_timeout_and_seed_pass():
    assert errors(DPO, [f"grid.timeout_s={preflight.GRID_TIMEOUT_MAX_S}", f"job.seed={2**63 - 1}"]) == {}


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
