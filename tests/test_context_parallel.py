"""Context parallelism (dist/context_parallel.py, models/packing.set_context_parallel) gives the
one-rank velocities and parameter gradients, on groups of 2 and of 4 CPU ranks.

One torchrun world of 4 gloo ranks (tests/_context_parallel_worker.py) runs every case on the
whole world (a group of 4) and on two groups of 2, against the same forward without context
parallelism in the same process, then one FSDP2 backward over 2 data-parallel x 2 context-parallel
ranks against one process. The tiny preset has 4 attention heads and 2 KV heads: a group of
2 splits the KV heads, a group of 4 repeats them first.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos_rl.dist.context_parallel import ContextParallel
from cosmos_rl.models.build import build_preset
from cosmos_rl.models.packing import context_parallel_of, set_context_parallel

REPO = Path(__file__).resolve().parents[1]
CASES = ("t2v", "i2v", "action", "action_checkpointed")
SIZES = (2, 4)


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("cp") / "results.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",  # keep gloo traffic on loopback
        "PYTHONWARNINGS": "ignore::UserWarning",
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4",
        "--master_addr=127.0.0.1", f"--master_port={_free_loopback_port()}",
        str(REPO / "tests" / "_context_parallel_worker.py"), str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == 4
    return results


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", CASES)
def test_velocities_and_gradients_equal_the_one_rank_computation(ranks, case, size):
    for rank, results in enumerate(ranks):
        result = results[f"{case}/{size}"]
        where = f"rank {rank}, {case} on {size} ranks"
        assert result["velocity_diff"] <= 1e-6, where
        assert result["grad_keys_match"], where
        assert result["grad_diff"] <= 1e-6, where
        # Not vacuous: real gradients on every weight that shapes the output (text tower included).
        assert result["grad_max"] > 1e-3 and result["grad_count"] >= 55, where
        # The action cases return the action velocity too, and their heads get gradients.
        if case.startswith("action"):
            assert result["outputs"] == 2 and result["grad_count"] > 55, where
        else:
            assert result["outputs"] == 1, where
        # Each rank really held 1/size of the batch's vision (+ action) rows: 2 samples of 48 (+4).
        per_sample = 52 if case.startswith("action") else 48
        assert result["local_rows"] == 2 * per_sample // size, where


@pytest.mark.slow
def test_fsdp2_over_data_x_context_ranks_gives_the_gradients_of_the_mean_loss(ranks):
    # 2 data-parallel x 2 context-parallel ranks (dist.context_parallel.data_context_layout), FSDP2
    # over all 4: each context group trains its own action batch, and the reduced gradients equal
    # one process's gradients of the mean of the two batches' losses.
    layout = [(results["fsdp_dp2_cp2"]["dp_rank"], results["fsdp_dp2_cp2"]["cp_rank"]) for results in ranks]
    assert layout == [(0, 0), (0, 1), (1, 0), (1, 1)]  # consecutive ranks share a context group
    for rank, results in enumerate(ranks):
        result = results["fsdp_dp2_cp2"]
        assert result["grad_keys_match"] and result["grad_max"] > 1e-3, rank
        assert result["grad_diff"] <= 1e-6, rank


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_a_token_count_that_does_not_split_names_the_key_and_the_fix(ranks, size):
    for results in ranks:
        message = results[f"odd/{size}"]
        assert f"17 vision/action tokens of this batch do not split over grid.context_parallel = {size}" in message


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_ranks_of_a_group_fed_different_batches_all_raise_instead_of_mixing_samples(ranks, size):
    others = "[1]" if size == 2 else "[1, 2, 3]"
    for results in ranks:
        assert results[f"mismatch/{size}"].startswith(f"context-parallel ranks {others} got another batch than rank 0"), results[f"mismatch/{size}"]


def test_heads_that_do_not_split_are_refused_before_any_forward():
    transformer = build_preset("tiny", seed=0).transformer  # 4 attention heads
    with pytest.raises(ValueError, match="4 attention heads do not split over 3 .*grid.context_parallel"):
        set_context_parallel(transformer, ContextParallel(group=None, rank=0, size=3))
    assert context_parallel_of(transformer) is None


def test_a_group_of_one_is_no_context_parallelism():
    transformer = build_preset("tiny", seed=0).transformer
    set_context_parallel(transformer, ContextParallel(group=None, rank=0, size=1))
    assert context_parallel_of(transformer) is None
    set_context_parallel(transformer, ContextParallel(group=None, rank=0, size=2))
    assert context_parallel_of(transformer).size == 2
    set_context_parallel(transformer, None)
    assert context_parallel_of(transformer) is None


# ---------------------------------------------------------------------- grid.context_parallel
DPO = REPO / "manifests" / "dpo_t2i_smoke.toml"  # 2 ranks, the tiny preset: 4 heads (2 KV), 16 vision tokens
WORLD = REPO / "manifests" / "sft_world_pusht_public_8gpu.toml"  # 8 ranks, forward dynamics: action rows


def _problems(manifest: Path, overrides: list[str]) -> list:
    from cosmos_rl.config import load

    _, problems = load.load_all_problems(manifest, overrides)
    return [p for p in problems if p.path == "grid.context_parallel"]


def test_one_rank_per_sample_is_the_default_and_passes():
    assert _problems(DPO, []) == [] and _problems(DPO, ["grid.context_parallel=1"]) == []
    [problem] = _problems(DPO, ["grid.context_parallel=0"])
    assert "must be >= 1" in problem.render()


NFT_VIDEO = REPO / "manifests" / "nft_video_shapes_cpu.toml"  # 4 heads; 5 frames at 32x32: 48 vision tokens


def test_a_size_that_fits_passes_for_dpo_and_sft_and_is_refused_for_an_algorithm_whose_loop_does_not_run_it():
    from cosmos_rl.config import load, preflight

    assert _problems(DPO, ["grid.context_parallel=2"]) == []
    assert _problems(WORLD, ["grid.context_parallel=2"]) == []  # SFT: 8 ranks, 4 heads, tokens that split
    # A registered algorithm that does not say its loop runs it (tests/standin_algorithms.py's).
    config = load.structure({"model": {"preset": "tiny"}, "grid": {"context_parallel": 2},
                             "rl": {"algorithm": "standin_algorithms:RANKS", "samples_per_step": 4}})  # fmt: skip
    found = [p for p in preflight.check(config) if p.path == "grid.context_parallel"]
    [problem] = [p for p in found if "does not run context parallel" in p.render()]
    assert problem.severity == "error"
    assert "rl.algorithm = 'standin_algorithms:RANKS' does not run context parallel in this release (wired: dpo, nft, sft, grpo;" in problem.render()
    assert "set grid.context_parallel = 1, or use rl.algorithm = 'dpo'" in problem.render()


def test_sft_splits_its_samples_over_data_parallel_ranks_and_refuses_the_vae_stage():
    from cosmos_rl.config import load
    from cosmos_rl.planning import plan

    # 8 ranks as 4 context groups of 2: 8 samples a step, 2 per group.
    config, problems = load.load_all_problems(WORLD, ["grid.context_parallel=2", "rl.samples_per_step=8"])
    assert [p for p in problems if p.path in ("grid.context_parallel", "rl.samples_per_step")] == []
    assert plan.build(config, str(WORLD))["per_step"] == {"samples": 8, "samples_per_rank": 2, "data_parallel_ranks": 4, "ranks_per_sample": 2}
    # 6 samples split over the 4 groups unevenly: named per group, not per rank.
    _, problems = load.load_all_problems(WORLD, ["grid.context_parallel=2", "rl.samples_per_step=6"])
    [uneven] = [p.render() for p in problems if p.path == "rl.samples_per_step"]
    assert "must split evenly over the 4 ranks" in uneven
    vae = [p.render() for p in _problems(WORLD, ["grid.context_parallel=2", 'rl.train="vae"'])]
    assert any('splits the transformer\'s tokens, and rl.train = "vae" trains the VAE' in line for line in vae), vae


def test_dpo_splits_its_pairs_over_data_parallel_ranks_and_not_with_a_data_actor():
    from cosmos_rl.config import load
    from cosmos_rl.planning import plan

    # 2 ranks as one context group: the 4 pairs of a step are one data-parallel rank's.
    config, problems = load.load_all_problems(DPO, ["grid.context_parallel=2", "rl.pairs_per_step=3"])
    assert [p for p in problems if p.severity == "error"] == []
    assert plan.build(config, str(DPO))["per_step"] == {"pairs": 3, "pairs_per_rank": 3, "data_parallel_ranks": 1, "ranks_per_sample": 2}
    per_role = _problems(DPO, ["grid.context_parallel=2", 'grid.backend="ray"', 'grid.grouping="per_role"'])
    assert any('runs with grid.grouping = "single" only' in p.render() for p in per_role), per_role


def test_nft_and_grpo_run_it_on_group_size_times_n_ranks():
    from cosmos_rl.config import load
    from cosmos_rl.planning import plan

    overrides = ["model.num_frames=5", "rl.group_size=2", "grid.context_parallel=2"]
    config, problems = load.load_all_problems(NFT_VIDEO, overrides)
    assert [p for p in problems if p.severity == "error"] == []
    assert plan.world_size(config)[0] == 4
    built = plan.build(config, str(NFT_VIDEO))
    assert built["context_parallel"]["layout"].startswith("2 data-parallel x 2 context-parallel ranks")
    assert built["per_step"]["data_parallel_ranks"] == 2 and built["per_step"]["ranks_per_sample"] == 2
    assert built["ray"]["actors"] == 4
    # grid.ranks is the world: group_size x N, named so in the refusal.
    _, problems = load.load_all_problems(NFT_VIDEO, [*overrides, "grid.ranks=2"])
    [ranks] = [p.render() for p in problems if p.path == "grid.ranks"]
    assert "must equal rl.group_size x grid.context_parallel (2 x 2 = 4)" in ranks and "set grid.ranks = 4" in ranks
    # GRPO runs on the same online machinery: the same world and layout.
    config, problems = load.load_all_problems(REPO / "manifests" / "grpo_video_shapes_cpu.toml", overrides)
    assert [p for p in problems if p.severity == "error"] == []
    assert plan.world_size(config)[0] == 4
    assert plan.build(config, str(REPO / "manifests" / "grpo_video_shapes_cpu.toml"))["per_step"]["ranks_per_sample"] == 2


def test_ranks_heads_and_tokens_that_do_not_split_are_each_named_with_the_sizes_that_would():
    rendered = [p.render() for p in _problems(DPO, ["grid.context_parallel=3"])]
    assert any("must divide the run's 2 ranks" in line for line in rendered), rendered
    assert any("does not divide the model's 4 attention heads" in line for line in rendered), rendered
    assert any("does not divide a sample's 16 vision tokens" in line for line in rendered), rendered
    # 2 is the one size above 1 dividing 2 ranks, 4 heads and 16 tokens.
    assert all("set grid.context_parallel to one of [2]" in line for line in rendered[1:]), rendered


def test_kv_heads_that_do_not_split_are_a_warning_not_an_error():
    found = _problems(DPO, ["grid.context_parallel=4", "grid.gpus_per_node=4", "model.config.parallelism.data_parallel_shard_degree=4"])
    warnings = [p.render() for p in found if p.severity == "warning"]
    assert warnings == [
        "grid.context_parallel: does not divide the model's 2 KV heads: they are repeated to 4 before the all-to-all "
        "(2x the key/value traffic) (got 4); set grid.context_parallel to one of [2] to split them as they are"
    ]


@pytest.fixture
def eight_head_folder(tmp_path) -> Path:
    # The tiny preset's configs with 8 attention heads: at 96x96 a frame is 24x24 cells, 144 tokens.
    from _model_folders import stub_model_folder

    from cosmos_rl.models.architectures import TINY_TRANSFORMER, TINY_VAE

    folder = stub_model_folder(tmp_path / "model")
    (folder / "transformer" / "config.json").write_text(json.dumps({**TINY_TRANSFORMER, "num_attention_heads": 8}))
    (folder / "vae").mkdir()
    (folder / "vae" / "config.json").write_text(json.dumps(TINY_VAE))
    return folder


def test_action_rows_count_with_the_vision_tokens(eight_head_folder):
    # 5 frames: 5 latent frames x 144 = 720 vision tokens (8 divides), + 4 action rows = 724 (it does not).
    overrides = [f'model.path="{eight_head_folder}"', "model.num_frames=5", "grid.context_parallel=8"]
    rendered = [p.render() for p in _problems(WORLD, overrides)]
    assert any("does not divide a sample's 720 vision tokens + 4 action rows = 724" in line for line in rendered), rendered
    assert not any("attention heads" in line for line in rendered), rendered
    # The same model and size without action rows splits.
    plain = [p.render() for p in _problems(WORLD, overrides + ['model.condition.kind="none"', 'model.condition.source="none"'])]
    assert not any("does not divide a sample's" in line for line in plain), plain


def test_plan_says_what_one_rank_of_a_group_holds():
    from cosmos_rl.config import load
    from cosmos_rl.planning.media_cost import context_parallel_section
    from cosmos_rl.planning.plan import build

    config, _ = load.load_all_problems(DPO, ["grid.context_parallel=4", "grid.gpus_per_node=4", "model.config.parallelism.data_parallel_shard_degree=4"])
    section = context_parallel_section(config, DPO.parent)
    assert section["ranks"] == 4 and section["heads_per_rank"] == "1 of 4 in attention"
    assert section["kv_heads"] == "2: repeated to 4, then split"
    assert section["tokens_per_rank"] == "4 of a sample's 16 vision tokens"
    off, _ = load.load_all_problems(DPO, [])
    assert build(off, str(DPO))["context_parallel"]["summary"].startswith("off (grid.context_parallel = 1)")
