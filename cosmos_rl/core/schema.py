"""The run manifest as a tree of frozen attrs classes.

This module is the single source of truth for every knob: its name, type, default and the sentence
that documents it (``doc`` in the field metadata). ``docs/manifest.md`` is generated from it, so a
field without a doc fails the docs test. Cross-field rules live in ``config/preflight/``; this module only
declares shapes and defaults, and must stay free of heavy imports (``validate`` never imports torch).
"""

from __future__ import annotations

from typing import Literal, Optional, Union

import attrs


from cosmos_rl.core.schema_common import EvalConfig, FrameReduce, OptimizerConfig, PresetName, RLBase, frozen, knob, required, section

# --------------------------------------------------------------------------------------------- job
@frozen
class JobConfig:
    name: str = knob("cosmos_rl_run", "Run name; the run directory is `<output_dir>/<name>/`.")
    output_dir: str = knob("runs", "Folder that holds run directories (relative to the working directory).")
    seed: int = knob(0, "Root seed (0 to 2**63 - 1): model init, data order and every rollout seed derive from it.")
    log_every: int = knob(1, "Write a `metrics.jsonl` row every this many optimizer steps.")
    tensorboard: bool = knob(False, "Also write TensorBoard event files (needs the `tensorboard` package).")
    progress: bool = knob(True, "Show progress on rank 0 while training: a rich bar on a terminal; when stdout is not one (a log file, `nohup`, a batch job) plain lines on stdout instead, each with the step, the key metrics and the ETA, every `log_every` steps or `progress_every_s` seconds, whichever comes first.")
    progress_every_s: float = knob(30.0, "With `progress` and stdout not a terminal: a progress line at least this often (seconds), also while a step (or a checkpoint, an evaluation) runs longer (`running: N s since step K finished`). Changes nothing a run computes.")
    wandb_project: str = knob("", "Also log metrics to this Weights & Biases project (needs the `wandb` package); empty = off.")
    wandb_entity: str = knob("", "Weights & Biases entity (team or user) for `wandb_project`; empty = your default.")


# ------------------------------------------------------------------------------------------- model
@frozen
class LoraConfig:
    rank: int = knob(8, "LoRA rank for the policy adapter; 0 trains every weight (full fine-tune).")
    alpha: float = knob(16.0, "LoRA scaling numerator (the update is scaled by alpha / rank).")
    target_modules: list[str] = knob(
        attrs.Factory(list),
        "What the adapters wrap: tower names and/or module names. `generation` = the vision pathway's attention "
        "(`add_q_proj`, `add_k_proj`, `add_v_proj`, `to_add_out`; the public Cosmos3 RL recipe's choice), `generation_mlp` "
        "= its MLP (`mlp_moe_gen.*_proj`), `understanding` = the text tower (`to_q`, `to_k`, `to_v`, `to_out`, `mlp.*_proj`); "
        "tower names match full module paths, a module name matches as peft matches it (the name or a path ending in it, so "
        "`gate_proj` hits both towers' MLPs). Empty = the attention and MLP projections of both towers in every decoder "
        "layer, the default: `[\"generation\"]` trained the DPO shapes recipe measurably worse "
        "(docs/studies/2026-12-03-adapter-targets.md). With no adapter on the text tower its keys and values are computed "
        "once per prompt per step and reused (exact; docs/studies/2026-12-05-text-tower-reuse.md).",
    )


@frozen
class ParallelismConfig:
    data_parallel_shard_degree: int = knob(
        1, "FSDP2 shard width (ranks). DPO under torchrun: must equal grid.nodes * grid.gpus_per_node."
    )


@frozen
class ModelInnerConfig:
    parallelism: ParallelismConfig = section(ParallelismConfig, "Sharding layout of the model.")


def _square_default(model=None) -> Optional[int]:
    # `model.image_size` left out: 32, unless `height` or `width` name the size. Called without a
    # model (docs_gen reads the default that way) it is the plain default.
    return 32 if model is None or (model.height is None and model.width is None) else None


@frozen
class ConditionConfig:
    kind: str = knob(
        "none",
        "What every sample is given clean (core/condition.py): `none` (text to image or video), `first_frame` (image to "
        "video: frame 0 given, its latent frame held clean in rollouts, training and evaluation and left out of every loss), "
        "the world model's action modes over `[model.action]` (`forward_dynamics`: frame 0 and the actions given; `policy`: "
        "frame 0 given, frames and actions generated; `inverse_dynamics`: every frame given, actions generated), "
        "or an import string `package.module:ENTRY` naming a condition defined outside the package (docs/architecture.md, "
        "\"Adding a condition\").",
    )
    source: str = knob(
        "none",
        "Where the given frames come from: `image` (online runs: each prompt row's `image`, a JSONL rl.prompts.file, paths "
        "relative to it, the clip's exact size), `data` (SFT: each training clip's own frames), or a suite's name "
        "(`shapes_video`: the suite's ground truth of each caption, e.g. frame 0 of the moving-shapes world's clip at seed 0, "
        "what `cosmos-rl eval` conditions on; `pusht` with `forward_dynamics` on NFT: each prompt row a Push-T training-window "
        "key whose frame 0, actions and true states are rebuilt from it; `lerobot` with `forward_dynamics` on NFT or GRPO: each "
        "row a LeRobot dataset window key, `lerobot window episode=I start=K root=/abs/dataset`, judged against the recorded "
        "future; docs/world.md) or import string; `none` with kind `none`.",
    )
    probability: float = knob(
        1.0,
        "The share of training samples conditioned, in [0, 1]: SFT draws it per clip (0.5 trains one model for text to "
        "video and image to video); online runs condition every rollout (1).",
    )
    modes: list[str] = knob(
        attrs.Factory(list),
        "SFT of the world model: the action modes each training window draws its own from, with equal chances (e.g. "
        "[\"forward_dynamics\", \"policy\", \"inverse_dynamics\"]: one model for all three); `kind` must be one of them (the "
        "mode evaluation uses unless told). Empty = every window trains under `kind`.",
    )


@frozen
class ActionConfig:
    embodiment: str = knob(
        "",
        "The robot whose actions the world model's action modes read and write (core/actions.py): `pusht` (2 wide: the "
        "agent's target position), `bridge_orig_lerobot`, `droid_lerobot`, ... (Cosmos3's embodiments; each has its action "
        "projections and raw width). Required with an action-mode `model.condition.kind`; empty otherwise.",
    )
    view_point: str = knob(
        "ego_view",
        "The camera view the structured caption names: `ego_view`, `third_person_view`, `wrist_view`, `concat_view`, or "
        "empty for no framing sentence.",
    )
    offset: list[float] = knob(
        attrs.Factory(list),
        "Per raw action column, subtracted before `scale` divides: the model's row is (raw - offset) / scale (Push-T: "
        "[256, 256], its [0, 512] positions onto [-1, 1]). Empty with `scale` empty: raw actions are the rows, as the stock "
        "pipeline feeds them.",
    )
    scale: list[float] = knob(attrs.Factory(list), "Per raw action column, the divisor after `offset` (Push-T: [256, 256]); no zero entry.")
    execute: int = knob(
        0,
        "Policy-mode online runs (NFT, `model.condition.kind = \"policy\"`): how many leading rows of each generated action "
        "chunk the simulator executes for the reward (`pusht_chunk_coverage`: the coverage change they cause), as a receding "
        "horizon executes them; 0 = the whole chunk (`model.num_frames - 1` rows). At most the chunk.",
    )


@frozen
class ModelConfig:
    path: str = knob(
        "", "Local diffusers folder of the model (e.g. Cosmos3-Nano): architecture, VAE, tokenizer, scheduler and, unless `rl.init_from` says otherwise, weights. Name the model here or in `preset`, not both."
    )
    preset: Optional[PresetName] = knob(
        None, "Built-in model instead of `path` (no default: a manifest names its model): `tiny` (random weights from job.seed, CPU-sized), `shapes` (the shipped base pretrained on the shapes world, docs/sft.md), `shapes_video` (the shipped moving-shapes video base: 9 frames at 32x32, its VAE halves time, docs/video.md) or `pusht` (the shipped Push-T world model: 9 frames at 32x32 with action heads for `[model.action] embodiment = \"pusht\"`, docs/world.md)."
    )
    dtype: Literal["float32", "bfloat16"] = knob(
        "float32", "Compute dtype of the trainers' sharded transformer: `bfloat16` is FSDP2 mixed precision (bf16 weights and activations in the forward; float32 master weights, gradients, optimizer state, timesteps and positions: docs/scale.md, \"Precision\"). Runs on CPU too, but slower there than `float32`."
    )
    height: Optional[int] = knob(
        None, "Image height in pixels for training and sampling (multiple of 16); with `width`, instead of `image_size`. Unset: `image_size`."
    )
    width: Optional[int] = knob(
        None, "Image width in pixels for training and sampling (multiple of 16); with `height`, instead of `image_size`. Unset: `image_size`."
    )
    # Declared after height and width: its default (32) applies only when neither of them is set.
    image_size: Optional[int] = knob(
        attrs.Factory(_square_default, takes_self=True),
        "Square image side in pixels for training and sampling (multiple of 16): the shorthand for `height` = `width`. Give it or `height` and `width`, not both; 32 when none of the three is set.",
    )
    num_frames: int = knob(
        1, "Frames per sample: 1 makes images, more makes video (4k + 1 for the Wan VAE: 5, 9, 17, ...; docs/video.md)."
    )
    fps: float = knob(
        24.0, "Frame rate of a video sample: the prompt's duration sentence and the model's time positions (unused for images)."
    )
    condition: ConditionConfig = section(ConditionConfig, "What every sample is given clean: nothing (text to media) or its first frame (image to video), and from where (docs/video.md).")
    action: ActionConfig = section(ActionConfig, "The world model's action rows (an action-mode `model.condition.kind`): embodiment, caption view, normalisation (docs/world.md).")
    gradient_checkpointing: bool = knob(False, "Recompute decoder activations in backward to save memory.")
    lora: LoraConfig = section(LoraConfig, "Policy adapter; rank 0 means full fine-tuning.")
    config: ModelInnerConfig = section(ModelInnerConfig, "Model-parallel layout.")


# -------------------------------------------------------------------------------------------- grid
@frozen
class GridConfig:
    backend: Literal["local", "ray"] = knob(
        "local", "`local`: torchrun carries FSDP directly (DPO and SFT). `ray`: a Ray actor group, one actor per rank (DPO and SFT may use it; NFT requires it)."
    )
    grouping: Literal["single", "per_role"] = knob(
        "single", "`single`: every role shares one process per rank. `per_role` (DPO on Ray only): the data role in its own process."
    )
    gpu_placement: Literal["colocated", "disaggregated"] = knob(
        "colocated", "`colocated`: all roles share each rank's device and form one FSDP world."
    )
    gpus_per_role: Optional[dict[str, int]] = knob(None, "Per-role device overrides; unset for colocated NFT.")
    num_replicas: Optional[int] = knob(None, "NFT: execution replicas (must be 1); used when `shapes` is unset.")
    ranks: Optional[int] = knob(None, "NFT: model ranks per replica (must equal rl.group_size x grid.context_parallel) when `shapes` is unset.")
    shapes: Optional[dict[str, list[int]]] = knob(
        None, "NFT role shapes `{policy = [replicas, ranks], rollout = [replicas, ranks]}`; wins over num_replicas/ranks."
    )
    nodes: int = knob(1, "Nodes in the job (torchrun --nnodes; Ray nodes the placement spreads over).")
    gpus_per_node: int = knob(1, "Ranks per node (torchrun --nproc-per-node). On CPU a rank is a process.")
    device: Literal["auto", "cpu", "cuda"] = knob("auto", "Device for every rank; `auto` = CUDA when available.")
    ray_address: str = knob(
        "", "Existing Ray cluster to join (`ray://...` or `host:port`); empty = RAY_ADDRESS, else a local cluster."
    )
    cpus_per_rank: float = knob(
        0.0, "CPUs each Ray actor reserves; 0 = the local cluster's CPUs divided evenly among the ranks."
    )
    rdzv_endpoint: str = knob(
        "", "Multi-node torchrun: the operator's c10d rendezvous `host:port` (or env COSMOS_RL_RDZV_ENDPOINT)."
    )
    timeout_s: float = knob(
        600.0, "Seconds a collective or an actor call may take before the run fails naming the rank (at most 7 days)."
    )
    context_parallel: int = knob(
        1,
        "Ranks that share one sample's vision tokens (Ulysses context parallelism: each holds 1/N of them, an all-to-all "
        "over attention heads around every attention; text tokens are replicated on every rank). 1 = off. N must divide "
        "the attention heads and the vision (+ action) tokens per sample; KV heads that do not divide are repeated. "
        "NFT and GRPO run it (the world is rl.group_size x N ranks, each sample of a group on its own N), and DPO and SFT "
        "(the world's ranks are data-parallel x N; rl.pairs_per_step or rl.samples_per_step splits over the data-parallel "
        "ones; not SFT's VAE stage). Preflight refuses N > 1 for an algorithm whose loop does not run it (docs/long_clips.md).",
    )


# --------------------------------------------------------------------------------------------- DPO
@frozen
class PreferenceDataConfig:
    synthetic_pairs: int = knob(
        0, "Generate this many pairs in memory (a learnable colour preference; moving clips when model.num_frames > 1); non-zero ignores file sources."
    )
    synthetic_seed: int = knob(0, "Seed of the synthetic generator (0 to 2**63 - 1), offset from job.seed; ids carry it.")
    jsonl: str = knob("", "Preference JSONL: rows `{id, prompt, winner, loser}` with image paths (mp4 clip paths when model.num_frames > 1).")
    shards: list[str] = knob(attrs.Factory(list), "webdataset tar shards of pairs (`json`, `winner.png`, `loser.png`; `winner.mp4`, `loser.mp4` when model.num_frames > 1); entries may be brace patterns.")
    factory: str = knob("", "Custom source `module:function` returning a pair source; the only code a manifest imports.")
    factory_kwargs: dict[str, Union[str, int, float, bool]] = knob(
        attrs.Factory(dict), "Keyword arguments passed to `factory`."
    )
    cursor_resume: bool = knob(True, "Resume the pair cursor from checkpoints so a requeued run replays no pair.")
    shuffle: bool = knob(True, "Shuffle pair order each epoch (seeded from job.seed).")


@frozen
class ValidationConfig:
    every: int = knob(0, "Evaluate the held-out preference objective every this many steps; 0 = never.")
    max_pairs: int = knob(64, "At most this many held-out pairs per evaluation.")
    data: PreferenceDataConfig = section(
        PreferenceDataConfig, "The explicit held-out source (never an implicit split of the training data)."
    )


@frozen
class DPOConfig(RLBase):
    algorithm: Literal["dpo"] = required("`dpo` selects offline Diffusion-DPO.")
    beta: float = knob(1000.0, "Preference sharpness; large because the MSE is a per-element mean.")
    pairs_per_step: int = knob(8, "Preference pairs per optimizer step, split evenly over the ranks.")
    timestep_sampling: Literal["uniform", "logit_normal"] = knob(
        "uniform", "How training draws each sample's flow time t: `uniform`, t ~ U[0, 1); `logit_normal`, t = sigmoid(logit_mean + logit_std * z) "
        "with z ~ N(0, 1) (flow_grpo's DPO and SD3's training: more weight on the middle times)."
    )
    logit_mean: float = knob(0.0, "`logit_normal`: the mean of t's logit (0 centres t on 0.5; flow_grpo's DPO: 0).")
    logit_std: float = knob(1.0, "`logit_normal`: the std of t's logit, > 0 (flow_grpo's DPO: 1).")
    latent_cache: Literal["disk", "memory", "off"] = knob(
        "disk",
        "Encode each pair image (or clip) with the VAE once: `disk` keeps the latents under `<job.output_dir>/.cache/latents/` "
        "(shared by ranks and by later runs on the same data and VAE), `memory` per process, `off` re-encodes every step.",
    )
    data: PreferenceDataConfig = section(PreferenceDataConfig, "Training preference pairs.")
    validation: ValidationConfig = section(ValidationConfig, "Held-out preference validation.")


# --------------------------------------------------------------------------------------------- SFT
# The SFT table (rl.algorithm = "sft") is declared in schema_sft.
from cosmos_rl.core.schema_sft import CaptionDataConfig, PixelWeightsConfig, SFTConfig  # noqa: E402,F401


# ---------------------------------------------------------------------------------------- checkpoint
@frozen
class CheckpointConfig:
    every: int = knob(50, "Commit a checkpoint every this many steps (and always at the last step); 0 = last only.")
    keep: int = knob(2, "Keep the newest this many committed checkpoints; 0 keeps all.")


# ------------------------------------------------------------------------------------------- root
@frozen
class RunConfig:
    # One subclass of RLBase per algorithm, chosen by `rl.algorithm` through the registry
    # (config/algorithms.py) when the manifest is read.
    rl: RLBase = required("The algorithm and its knobs; `rl.algorithm` selects the rest of the table.")
    job: JobConfig = section(JobConfig, "Run naming, seeding and logging.")
    model: ModelConfig = section(ModelConfig, "The Cosmos3 model.")
    grid: GridConfig = section(GridConfig, "Topology and launch.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "Checkpoint cadence and retention.")


# The online tables (NFT, GRPO and what they share) are declared in schema_online.
from cosmos_rl.core.schema_online import GRPOConfig, GRPOOldPolicyConfig, JudgeConfig, NFTConfig, OldPolicyConfig, OnlineRLBase, PromptSourceConfig, RefPolicyConfig, RewardClientConfig, RewardConfig, WeightedRewardConfig

# Knobs added after checkpoint format 1 whose default reproduces what every run did before they
# existed. Left at that default they are not part of the run identity (plan.identity_fields), so run
# directories written before them still resume; set to anything else they are.
LATER_KNOB_DEFAULTS: dict[str, object] = {
    "model.num_frames": 1,
    "model.fps": 24.0,
    "model.condition.kind": "none",
    "model.condition.source": "none",
    "model.condition.probability": 1.0,
    "rl.x0_weighting": False,
    "rl.foreground_weight": 1.0,
    "rl.unclamped_loss": False,
    "rl.pixel_weights.suite": "",
    "rl.pixel_weights.classes": {},
    "rl.pixel_weights.miss": 1.0,
    "rl.rewards": [],
    "rl.reward_combine": "weighted_sum",
    "rl.ema_decay": 0.0,
    "rl.ema_every": 8,
    "rl.updates_per_step": 1,
    "rl.same_initial_noise": False,
    "rl.async_reward": False,
    "rl.optimizer.decay": "none",
    "rl.optimizer.decay_steps": 0,
    "rl.optimizer.min_lr_ratio": 0.0,
    "rl.reward.frame_reduce": "mean",
    "rl.reward.frame_stride": 1,
    # Keys of an array of tables stand for every entry (`rl.rewards[1].frame_reduce`).
    "rl.rewards[].frame_reduce": "mean",
    "rl.rewards[].frame_stride": 1,
    "rl.rewards[].dimensions": {},
    "rl.eval.suite": "",
    "model.condition.modes": [],
    "model.action.embodiment": "",
    "model.action.view_point": "ego_view",
    "model.action.offset": [],
    "model.action.scale": [],
    "model.action.execute": 0,  # policy mode's executed rows: the whole chunk (before policy-mode runs: no rows executed)
    "rl.data.lerobot": "",
    "rl.data.camera": "",
    # NFT's linear optimality map before `per_side` (DiffusionNFT's A = 0 -> 0.5 for any clamp).
    # Its new default computes the same for a symmetric clamp, where the identity leaves it out
    # (plan.identity_fields), so those runs keep their identity too.
    "rl.linear_map": "span",
    "rl.kl_form": "exact",
    "rl.timestep_sampling": "uniform",
    "rl.logit_mean": 0.0,
    "rl.logit_std": 1.0,
    "grid.context_parallel": 1,
    "rl.old.flat_steps": 0,  # NFT's old policy without a flat start
    "rl.clip_range_high": None,  # GRPO's symmetric clip
    "rl.ema_warmup": False,
    # A reward that is not a VLM judge (judge.model empty, every judge key at its default): what
    # every run before the judge existed did.
    **{f"{table}.judge.{key}": value
       for table in ("rl.reward", "rl.rewards[]")
       for key, value in attrs.asdict(JudgeConfig()).items()},  # fmt: skip
}

# Fields that may change on an exact resume without changing what the run computes.
NON_IDENTITY_FIELDS = frozenset(
    {
        "job.name",
        "rl.max_steps",
        "job.log_every",
        "job.tensorboard",
        "job.progress",
        "job.progress_every_s",
        "job.wandb_project",
        "job.wandb_entity",
        "job.output_dir",
        "checkpoint.every",
        "checkpoint.keep",
        "grid.ray_address",
        "grid.rdzv_endpoint",
        "grid.timeout_s",
        "rl.validation.every",
        "rl.latent_cache",
        "rl.validation.max_pairs",
        "rl.sample_grid_every",
        "rl.reward.url",
        "rl.reward.timeout_s",
        "rl.reward.max_retries",
        "rl.reward.backoff_s",
        "rl.reward.token_env",
        "rl.rewards[].url",
        "rl.rewards[].timeout_s",
        "rl.rewards[].max_retries",
        "rl.rewards[].backoff_s",
        "rl.rewards[].token_env",
        # Evaluation only reads the policy: it changes no weight, draw or cursor of the run.
        "rl.eval.every",
        "rl.eval.prompts",
        "rl.eval.per_task",
        "rl.eval.seeds",
        "rl.eval.reward",
        "rl.eval.hacking_window",
        "rl.eval.stop_on_hacking",
        "rl.eval.gold",
        "rl.eval.sample_steps",
        "rl.eval.guidance",
        # [[rl.eval.rewards]]: what the evaluation scores with, every key of every table.
        "rl.eval.rewards",
        *(f"rl.eval.rewards[].{field.name}" for field in attrs.fields(WeightedRewardConfig)),
    }
)


def non_identity(key: str) -> bool:
    """Whether a flattened key (`rl.rewards[1].url` included) may change on an exact resume."""
    import re

    return re.sub(r"\[\d+\]", "[]", key) in NON_IDENTITY_FIELDS

# Image NFT profiles this release supports: name -> the production coordinates it fixes.
T2I_PROFILES: dict[str, dict] = {
    "t2i_tiny": {"image_size": 32, "description": "CPU smoke: the built-in tiny model at 32x32"},
    "t2i_public": {"image_size": 512, "description": "public Cosmos3-Nano T2I recipe at 512x512"},
}

# Resolve the string annotations once so that tools walking the tree (docs, did-you-mean) see types.
for _cls in list(globals().values()):
    if isinstance(_cls, type) and attrs.has(_cls):
        attrs.resolve_types(_cls, globals())
