"""The CLI as a user meets it: exit codes, one-pass error lists, JSON output, no heavy imports."""

import json
import subprocess
import sys
from pathlib import Path

from _inproc import cosmos
from _model_folders import stub_model_folder

ROOT = Path(__file__).resolve().parent.parent
NFT = str(ROOT / "manifests" / "nft_t2i_smoke.toml")
DPO = str(ROOT / "manifests" / "dpo_t2i_smoke.toml")


def cli(*args: str, cwd: Path = ROOT):
    """In-process (tests/_inproc.py): these tests read exit codes and words, not the process; the
    entry point (`python -m cosmos_rl.cli`) is the subject of test_version_prints_the_packages_version."""
    return cosmos(*args, cwd=cwd)


def test_validate_ok_prints_a_summary():
    result = cli("validate", NFT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK") and "world_size  4" in result.stdout


def test_validate_reports_every_problem_without_traceback():
    result = cli("validate", DPO, "rl.beta=-1", "rl.max_steps=0", 'grid.backend="x"', "rl.bta=3")
    assert result.returncode == 2
    for key in ("rl.beta:", "rl.max_steps:", "grid.backend:", "rl.bta:"):
        assert key in result.stderr
    assert "did you mean rl.beta?" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_validate_json_shape():
    good = json.loads(cli("validate", NFT, "--json").stdout)
    assert good["ok"] is True and good["summary"]["algorithm"] == "nft"
    bad_run = cli("validate", NFT, "--json", "rl.r_tau=0.0")
    bad = json.loads(bad_run.stdout)
    assert bad_run.returncode == 2 and bad["ok"] is False
    assert bad["problems"][0] == {"path": "rl.r_tau", "problem": "must be > 0", "fix": "set rl.r_tau to a positive number", "severity": "error", "got": 0.0}


def test_validate_does_not_import_torch_ray_or_diffusers():
    code = (
        "import sys\nfrom cosmos_rl.cli import app\n"
        f"try:\n    app(['validate', {NFT!r}])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'diffusers', 'transformers', 'peft') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr


def test_plan_json_nft():
    result = cli("plan", NFT, "--json")
    plan = json.loads(result.stdout)
    assert plan["algorithm"] == "nft" and plan["backend"] == "ray" and plan["grouping"] == "single"
    assert plan["gpu_placement"] == "colocated" and plan["world_size"] == 4
    assert plan["shapes"] == {"policy": [1, 4], "rollout": [1, 4]}
    assert plan["launch"][:2] == ["cosmos-rl", "train"]
    assert plan["sampler"]["guidance_semantics"].startswith("v = v_uncond + g * (v_cond - v_uncond)")
    assert plan["reward"]["revision"] == "builtin-v1"


def test_plan_json_dpo_launches_torchrun_with_the_shard_degree():
    plan = json.loads(cli("plan", DPO, "--json").stdout)
    assert plan["world_size"] == 2 and plan["per_step"] == {"pairs": 8, "pairs_per_rank": 4}
    argv = plan["launch"]
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in argv and "--nnodes=1" in argv and "--local-addr=127.0.0.1" in argv
    assert argv[-1].endswith("runs/dpo_t2i_smoke/manifest.toml")
    assert "ref" not in " ".join(plan["checkpoint"]["contents"])


def test_plan_multinode_torchrun_uses_the_operator_endpoint():
    plan = json.loads(cli("plan", DPO, "--json", "grid.nodes=2", "model.config.parallelism.data_parallel_shard_degree=4", 'grid.rdzv_endpoint="10.0.0.1:29400"').stdout)
    assert "--nnodes=2" in plan["launch"] and "--rdzv-endpoint=10.0.0.1:29400" in plan["launch"]
    assert "--rdzv-backend=c10d" in plan["launch"]


def test_plan_identity_changes_with_identity_fields_only():
    base = json.loads(cli("plan", NFT, "--json").stdout)["identity"]
    assert json.loads(cli("plan", NFT, "--json", "rl.max_steps=7").stdout)["identity"] == base
    assert json.loads(cli("plan", NFT, "--json", 'rl.reward.revision="v2"').stdout)["identity"] != base
    assert json.loads(cli("plan", NFT, "--json", 'rl.rollout_seed_clock="optimizer_step"').stdout)["identity"] != base


def test_plan_renders_a_table():
    result = cli("plan", NFT)
    assert result.returncode == 0
    assert "guidance" in result.stdout and "conditional only" in result.stdout and "run identity" in result.stdout


PUBLIC_NFT = ROOT / "manifests" / "nft_t2i_public_4gpu.toml"
PUBLIC_DPO = str(ROOT / "manifests" / "dpo_t2i_public_4gpu.toml")


def test_plan_shows_the_resolved_base_its_cache_and_the_skip_patterns(tmp_path):
    folder = stub_model_folder(tmp_path / "nano", flow_shift=3.0)
    plan = json.loads(cli("plan", str(PUBLIC_NFT), "--json", f'model.path="{folder}"').stdout)
    base = plan["base"]
    assert base["init_from"] == "s3://cosmos3-checkpoints/nano-dcp" and base["kind"] == "s3"
    assert base["skip_patterns"] == ["audio_*", "action_*"]
    assert Path(base["cache_dir"]).parent == Path("runs/.cache/init_from")
    assert base["resolved"].startswith("s3://cosmos3-checkpoints/nano-dcp -> " + base["cache_dir"])
    assert (plan["sampler"]["shift"], plan["sampler"]["shift_from"]) == (5.0, "rl.sampler_shift")

    text = cli("plan", str(PUBLIC_NFT), f'model.path="{folder}"', f'rl.init_from="{folder}"').stdout
    assert "rl.init_from = " in text and "skipping keys: audio_*, action_*" in text

    dpo = json.loads(cli("plan", PUBLIC_DPO, "--json", f'model.path="{folder}"').stdout)["base"]
    assert dpo["kind"] == "model.path" and dpo["resolved"] == f"model.path's own weights, {folder / 'transformer'}"


def test_plan_shows_the_folder_shift_when_the_manifest_sets_none(tmp_path):
    folder = stub_model_folder(tmp_path / "nano", flow_shift=3.0)
    manifest = tmp_path / "nft.toml"
    manifest.write_text("\n".join(line for line in PUBLIC_NFT.read_text().splitlines() if not line.startswith("sampler_shift")))
    sampler = json.loads(cli("plan", str(manifest), "--json", f'model.path="{folder}"').stdout)["sampler"]
    assert (sampler["shift"], sampler["shift_from"]) == (3.0, str(folder / "scheduler" / "scheduler_config.json"))


def test_plan_of_a_manifest_that_names_no_model_yet_lists_the_problems():
    """The Push-T NFT manifest waits for its base (model.path and rl.init_from empty): plan says so
    by key, exit 2, no traceback (it once raised KeyError while reading the sampler's shift)."""
    result = cli("plan", str(ROOT / "manifests" / "nft_pusht_dynamics_cpu.toml"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "model.path: no model named" in result.stderr and "rl.init_from: required" in result.stderr


def test_plan_reads_a_key_the_folder_config_leaves_out_as_the_class_default(tmp_path):
    """A transformer config without `hidden_size` is what from_config builds with the class
    default; plan's costs are those of the same folder with the default written out."""
    import inspect

    from diffusers import Cosmos3OmniTransformer

    from cosmos_rl.models.architectures import PRESET_ARCHITECTURES

    transformer, vae = PRESET_ARCHITECTURES["tiny"]
    default = inspect.signature(Cosmos3OmniTransformer.__init__).parameters["hidden_size"].default
    assert transformer["hidden_size"] != default
    plans = []
    for name, edit in (("left_out", lambda c: c.pop("hidden_size")), ("written", lambda c: c.__setitem__("hidden_size", default))):
        folder = stub_model_folder(tmp_path / name)
        config = dict(transformer)
        edit(config)
        (folder / "transformer" / "config.json").write_text(json.dumps(config))
        (folder / "vae").mkdir()
        (folder / "vae" / "config.json").write_text(json.dumps(vae))
        result = cli("plan", str(PUBLIC_NFT), "--json", f'model.path="{folder}"')
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        plans.append(json.loads(result.stdout)["media"])
    assert "activation_mib_per_sample" in plans[0] and plans[0] == plans[1]


def test_plan_of_the_public_video_manifests_prints_the_kept_activations_per_rank(tmp_path):
    """The 8-GPU T2V manifests' plan on a folder with Nano's layout at tiny widths (configs only):
    hidden 64, MLP 128, 2 layers, patch 2, a VAE 4x in space and time. 17 frames of 480x832 are
    5 x 120 x 208 latents, 5 x 60 x 104 = 31,200 tokens; with gradient checkpointing in bfloat16 a
    clip keeps 2 x 31200 x 64 x 2 B of layer inputs + one layer's 31200 x (12 x 64 + 4 x 128) x 2 B
    = 87,859,200 B. NFT keeps 2 rows x 4 training timesteps of clips per rank, DPO 2 pairs x 2 sides."""
    from _video_folders import nano_transformer, temporal_vae

    folder = stub_model_folder(tmp_path / "nano", flow_shift=3.0)
    nano_transformer(320).save_config(folder / "transformer")
    temporal_vae().save_config(folder / "vae")
    clip = 87_859_200 / 2**20
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    plans = {}
    for name, extra, clips in (("nft_t2v_public_8gpu", [], 2 * 4), ("dpo_t2v_public_8gpu", [f'rl.data.jsonl="{pairs}"'], 2 * 2)):
        result = cli("plan", str(ROOT / "manifests" / f"{name}.toml"), "--json", f'model.path="{folder}"', *extra)
        assert result.returncode == 0, result.stderr
        plans[name] = plan = json.loads(result.stdout)
        assert plan["world_size"] == 8 and plan["media"]["frames"] == 17 and plan["media"]["size"] == [480, 832], name
        assert plan["per_step"]["train_activation_mib_per_rank"] == round(clips * clip, 2), name
    assert plans["nft_t2v_public_8gpu"]["reward"]["frames"].startswith("frames 0, 4, 8, 12, 16 of each clip, their mean (if the service scores images")


def test_plan_says_which_frames_of_a_clip_a_reward_scores():
    from cosmos_rl.planning import plan
    from cosmos_rl.config import load

    video = ROOT / "manifests" / "nft_video_shapes_cpu.toml"  # 9 frames

    def frames(*overrides):
        return plan.build(load.load(video, list(overrides)), str(video))["reward"]["frames"]

    assert frames() == "whole clips (a clip reward)"  # shapes_video_partial, built in
    assert frames('rl.reward.name="brightness"', 'rl.reward.frame_reduce="last"') == "frame 8 of each clip alone"
    assert frames('rl.reward.name="brightness"', "rl.reward.frame_stride=3", 'rl.reward.frame_reduce="min"') == "frames 0, 3, 6 of each clip, their min"
    assert "frames" not in plan.build(load.load(NFT), NFT)["reward"]  # an image run


def test_validate_refuses_a_folder_config_out_of_bounds_before_anything_loads(tmp_path):
    folder = stub_model_folder(tmp_path / "nano")
    (folder / "transformer" / "config.json").write_text(json.dumps({"hidden_size": -1}))
    (folder / "vae").mkdir()
    (folder / "vae" / "config.json").write_text('{"z_dim": ')
    result = cli("validate", str(PUBLIC_NFT), f'model.path="{folder}"')
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "hidden_size is -1" in result.stderr and "repair transformer/config.json" in result.stderr
    assert "vae/config.json" in result.stderr and "repair vae/config.json" in result.stderr


def test_train_of_a_gpu_manifest_on_a_cpu_machine_points_at_the_gpus(tmp_path):
    import os

    folder = stub_model_folder(tmp_path / "nano")
    # A subprocess: CUDA reads CUDA_VISIBLE_DEVICES once per process, so setting it here would not hide a GPU.
    result = subprocess.run(
        [sys.executable, "-m", "cosmos_rl.cli", "train", PUBLIC_DPO, f'model.path="{folder}"', f'job.output_dir="{tmp_path}"'],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "grid.device" in result.stderr and "visible CUDA GPU(s)" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "dpo_t2i_public_4gpu").exists()


def test_train_refuses_an_invalid_manifest_with_exit_2():
    result = cli("train", NFT, 'rl.reward.revision=""')
    assert result.returncode == 2 and "rl.reward.revision" in result.stderr


def test_train_validate_manifest_flag_is_a_usage_error_not_a_run():
    result = cli("train", NFT, "--validate-manifest")
    assert result.returncode == 2 and "No such option" in result.stderr


def test_unknown_option_is_a_usage_error():
    assert cli("validate", NFT, "--jsn").returncode == 2


def test_resume_refuses_a_folder_that_is_not_a_run(tmp_path):
    result = cli("resume", str(tmp_path), "--exact")
    assert result.returncode == 2 and "not a run directory" in result.stderr


def test_relative_paths_are_read_from_the_manifest_folder(tmp_path):
    (tmp_path / "prompts.txt").write_text("a red square\n")
    manifest = tmp_path / "m.toml"
    manifest.write_text(Path(NFT).read_text().replace('[rl.optimizer]', '[rl.prompts]\nfile = "prompts.txt"\n\n[rl.optimizer]'))
    assert cli("validate", str(manifest), cwd=ROOT).returncode == 0


def test_an_unreachable_reward_service_at_start_is_exit_2_naming_the_url(tmp_path):
    """Checked before Ray starts: nothing listens on port 1 of loopback."""
    result = cli("train", NFT, 'rl.reward.url="http://127.0.0.1:1"', "rl.reward.max_retries=0",
                 "rl.reward.timeout_s=2.0", f'job.output_dir="{tmp_path}"')
    assert result.returncode == 2, result.stderr
    assert "rl.reward.url: the reward service at http://127.0.0.1:1 cannot be reached" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "nft_t2i_smoke" / "placement.json").exists()  # no actor group was started


def test_validate_prints_the_identity_the_run_then_records(tmp_path):
    """nft_shapes_cpu names its prompt file relatively (rl.prompts.file = "shapes_train.txt"); the run
    records the identity of the manifest.toml `train` writes (paths made absolute), and validate
    and plan print that same identity, whatever the working directory."""
    from cosmos_rl.config import load
    from cosmos_rl.planning import plan, run_dir as run

    manifest = ROOT / "manifests" / "nft_shapes_cpu.toml"
    config, run_dir = run.pin_paths(load.load(manifest, [f'job.output_dir="{tmp_path}"']), manifest)
    run.prepare_new(config, run_dir)  # what `cosmos-rl train` writes before the backend starts
    recorded = plan.run_identity(load.load(run_dir / "manifest.toml", saved_run=True))  # what the trainers put in meta.json
    shown = json.loads(cli("validate", "manifests/nft_shapes_cpu.toml", "--json", "--data", "none").stdout)["summary"]["identity"]
    assert shown == recorded
    elsewhere = cli("plan", str(manifest), "--json", cwd=tmp_path)
    assert json.loads(elsewhere.stdout)["identity"] == recorded


def _every_help_text():
    """(command path, parameter or "help", text) of every command and parameter of `cosmos-rl`."""
    import inspect

    import typer

    from cosmos_rl.cli import app

    def walk(command, path):
        yield path, "help", inspect.cleandoc(command.help or "")
        for param in command.params:
            yield path, param.name, inspect.cleandoc(getattr(param, "help", None) or "")
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    return list(walk(typer.main.get_command(app), "cosmos-rl"))


def test_no_help_text_loses_words_to_rich_markup():
    """Typer renders help through rich markup, which swallows a bracketed word ("a run's [rl.eval] or
    rl.sample_steps" printed as "a run's  or rl.sample_steps"): every `[` in a help text is escaped."""
    from rich.text import Text

    texts = _every_help_text()
    assert len(texts) > 50
    damaged = [(path, name, text) for path, name, text in texts if Text.from_markup(text).plain != text.replace("\\[", "[")]
    assert damaged == []
    shown = cli("pairs", "mine", "--help", cwd=ROOT).stdout
    assert "[rl.eval] or rl.sample_steps" in " ".join(shown.replace("│", " ").split())


def test_version_prints_the_packages_version():
    import tomllib

    import cosmos_rl

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cosmos_rl.__version__ == declared
    # The one test of the `python -m cosmos_rl.cli` entry wiring, so a subprocess (costs no torch import).
    result = subprocess.run([sys.executable, "-m", "cosmos_rl.cli", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0 and result.stdout == f"cosmos-rl {declared}\n"
