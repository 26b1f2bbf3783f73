"""The manifest schema's building blocks: the field helpers every table is declared with, and the
tables every algorithm's `rl` shares (optimizer, `[rl.eval]`, `RLBase`). `config/schema.py` (and
`config/schema_online.py`) build on these and re-export them; the rest of the code names them
through `config/schema.py`.
"""

from __future__ import annotations

from typing import Literal, Optional

import attrs


def knob(default, doc: str, **kwargs):
    """A field with its documentation attached; ``default`` may be an attrs Factory."""
    return attrs.field(default=default, metadata={"doc": doc}, **kwargs)


def section(cls, doc: str):
    """A nested table whose defaults come from ``cls``."""
    return attrs.field(factory=cls, metadata={"doc": doc})


def required(doc: str):
    return attrs.field(metadata={"doc": doc})


frozen = attrs.frozen(kw_only=True)

# Built-in model presets (`model.preset`, `rl.init_from = "preset:NAME"`).
PresetName = Literal["tiny", "shapes", "shapes_video", "pusht"]

# How an image reward's frame scores make a clip's score (the reduction is rewards/frames.py).
FrameReduce = Literal["mean", "min", "first", "last"]


# --------------------------------------------------------------------------------------- optimizer
@frozen
class OptimizerConfig:
    lr: float = knob(1e-4, "AdamW learning rate.")
    weight_decay: float = knob(0.0, "AdamW decoupled weight decay.")
    betas: list[float] = knob(attrs.Factory(lambda: [0.9, 0.999]), "AdamW moment coefficients [beta1, beta2].")
    eps: float = knob(1e-8, "AdamW denominator epsilon.")
    grad_clip: float = knob(1.0, "Clip the global gradient norm to this; 0 disables clipping.")
    warmup_steps: int = knob(0, "Linear learning-rate warm-up over this many steps, then constant (or the decay).")
    decay: Literal["none", "linear", "cosine"] = knob(
        "none", "Learning-rate decay after the warm-up: `none` keeps lr; `linear` or `cosine` brings it to lr x min_lr_ratio at optimizer step decay_steps and holds it there.")
    decay_steps: int = knob(
        0, "The optimizer step at which the decay ends (counted from 0, warm-up included; a GRPO run takes rl.updates_per_step a step). Its own knob, not rl.max_steps, so extending a run on resume does not reshape the LR it already followed. 0 with decay = `none`.")
    min_lr_ratio: float = knob(0.0, "The decay's end as a fraction of lr, in [0, 1].")


# ------------------------------------------------------------------------------------------ rewards
# The VLM judge's defaults: a 0-10 rating read from "Score: N" (rewards/vlm_judge.py).
JUDGE_PROMPT = ('Rate from 0 to 10 how well the image matches the caption "{prompt}": shapes, colours, counts and positions. '
                'Answer with "Score: N" and nothing else.')  # fmt: skip
JUDGE_REGEX = r"(?i)score\s*[:=]\s*(-?[0-9]+(?:\.[0-9]+)?)"


@frozen
class JudgeConfig:
    """A VLM judge over the OpenAI-compatible chat API (vLLM, SGLang) as the reward (docs/judge.md)."""

    model: str = knob("", "The model the judge server serves (its `GET {url}/models` id), e.g. `Qwen/Qwen2.5-VL-7B-Instruct`; set, the reward is this judge at the table's `url` (the API root, e.g. `http://127.0.0.1:8000/v1`) instead of a reward service; empty = not a judge.")
    prompt: str = knob(JUDGE_PROMPT, "The instruction sent after the image(s); `{prompt}` is replaced by the sample's caption (the only placeholder).")
    frames: int = knob(1, "Clips: this many frames, evenly spaced from the first to the last, go to the judge in one message (1 = the first frame). Images: the image itself. >= 1.")
    score_regex: str = knob(JUDGE_REGEX, "Python regular expression searched in the judge's answer; its first capture group (group 1) is the score, a number. No match, or a number outside score_range, stops the step with the sample and the answer named (never a 0).")
    score_range: list[float] = knob(attrs.Factory(lambda: [0.0, 10.0]), "[lo, hi]: the scores the judge may give (inclusive); the reward is the score as given, not rescaled.")
    max_tokens: int = knob(32, "The answer's token limit (`max_tokens`); the judge samples at temperature 0.")
    concurrency: int = knob(8, "Judge requests in flight at once (one per sample) from each rank.")


@frozen
class RewardClientConfig:
    """How the run reaches one reward service (shared by `[rl.reward]` and each `[[rl.rewards]]`)."""

    url: str = knob("", "Reward service URL; empty = start a built-in service for this reward on a free loopback port.")
    revision: str = knob("", "Provider revision the service must declare (required; of `[[rl.rewards]]` and `[rl.reward]`, part of the run identity).")
    timeout_s: float = knob(30.0, "Seconds to wait for one scoring request.")
    max_retries: int = knob(3, "Retries after a failed request before the run (or its evaluation) stops.")
    backoff_s: float = knob(0.5, "First retry delay; doubles on each retry.")
    token_env: str = knob("", "Environment variable holding a bearer token for the service; empty = none.")
    frame_reduce: FrameReduce = knob("mean", "Video runs, an image reward (its service lists no `video` modality) scoring clips frame by frame: the clip's score is the `mean` or `min` of its scored frames' scores, or the score of its `first` or `last` frame alone (docs/rewards.md). Image runs: leave it.")
    frame_stride: int = knob(1, "Video runs, an image reward: score every this many frames, from frame 0 (1 = every frame; with `frame_reduce` `mean` or `min`). Image runs: leave it.")
    judge: JudgeConfig = section(JudgeConfig, "A VLM judge as this reward (`judge.model` set): the url is its OpenAI-compatible API root; timeout_s, max_retries, backoff_s and token_env apply to each judge request.")


@frozen
class WeightedRewardConfig(RewardClientConfig):
    name: str = knob("", "Reward the service computes (required), e.g. `pickscore` or `brightness`; unique within its list (rl.rewards, rl.eval.rewards).")
    weight: float = knob(1.0, "Weight of this reward (> 0): in the combined advantage (rl.rewards; see rl.reward_combine), or in `eval/score`, the weighted sum (rl.eval.rewards).")
    reward_revision: str = knob(
        "", "The reward's own revision as the service's /info lists it under `revisions` (model rewards: a hash of the weights); empty = not pinned."
    )
    model: str = knob("", "Built-in service only (url empty): local folder of a model reward (`pickscore`, `clipscore`, `aesthetic`, `hps`, `videoalign`) to load.")
    dimensions: dict[str, float] = knob(
        attrs.Factory(dict), "A reward with named dimensions (its service's /info lists them; VideoAlign: `vq`, `mq`, `ta`): use the weighted sum of these dimensions (each weight > 0) as this reward's score instead of its own, e.g. `{vq = 1.0, mq = 1.0}` for VideoAlign without text alignment; empty = the reward's own score (VideoAlign: VQ + MQ + TA). Every dimension is logged either way (docs/video_rewards.md)."
    )


# -------------------------------------------------------------------------------------------- eval
@frozen
class EvalConfig:
    every: int = knob(0, "Evaluate the policy on held-out prompts every this many steps (`eval/` metrics); 0 = never. A multiple of job.log_every.")
    prompts: str = knob("", "Prompt file (text or JSONL, every prompt in file order); empty = the suite's held-out prompts (docs/eval.md).")
    per_task: int = knob(8, "With the suite's held-out default: at most this many prompts per task, evenly spread; 0 = all (319 for the shapes suite).")
    seeds: int = knob(2, "Sampling seeds per prompt (seeds 0 .. N-1, the same noise for every run and call).")
    reward: str = knob("shapes_strict", "Built-in reward that scores the images: one of the suite's (its verifier, both scores: `shapes_strict` or `shapes_partial` of the shapes suite; a video run (model.num_frames > 1) names a clip suite's, `shapes_video_strict` or `shapes_video_partial`; a suite outside the package's is `package.module:SUITE/REWARD`) or, for images, a weight-free one (one score).")
    suite: str = knob("", "The suite (world) the evaluation scores in: its held-out prompts, its verifier, its first frames for an image-to-video run (docs/eval.md, \"Suites\"): `shapes`, `shapes_video`, or `package.module:SUITE` for a suite outside the package (importable by every process); empty = the suite that registers rl.eval.reward, else one that registers the training reward, else `shapes` (`shapes_video` for a video run).")
    rewards: list[WeightedRewardConfig] = knob(
        attrs.Factory(list), "Score the evaluation with rewards served as a run's are, one `[[rl.eval.rewards]]` table each (the fields of `[[rl.rewards]]`): a model reward from a local folder (`model`), a service's (`url`), several weighted; `eval/score` is the weighted sum (no partial score), over the suite's prompts or rl.eval.prompts. Empty = rl.eval.reward in-process. Also what `cosmos-rl eval RUN_DIR` scores with when given no --reward."
    )
    hacking_window: int = knob(3, "Warn of reward hacking when over the last this many evaluations the training reward rose while `eval/score` fell beyond its noise (its paired-bootstrap 95% interval wholly below 0), or, on a run of several rewards, one reward's per-step mean fell beyond its scatter while the total rose (docs/eval_training.md, \"The reward-hacking watch\").")
    gold: str = knob("", "A second held-out reward, distinct from the training reward(s) and from rl.eval.reward, scoring the same evaluation samples (`eval/gold`, `eval/gold_lo`, `eval/gold_hi`): the reward-hacking watch then judges its trend instead of `eval/score`'s. One of the evaluation suite's rewards or, for images, a weight-free one; empty = none.")
    stop_on_hacking: bool = knob(False, "Stop the run at the first reward-hacking warning: commit that step's checkpoint and exit 3 (`cosmos-rl resume RUN_DIR` continues it, e.g. with this off). Needs rl.eval.every > 0.")
    sample_steps: int = knob(0, "Sampler steps of the evaluation (and of `cosmos-rl eval RUN_DIR`); 0 = the run's own (NFT and GRPO: rl.sample_steps; DPO and SFT: 20).")
    guidance: Optional[float] = knob(None, "Guidance of the evaluation (and of `cosmos-rl eval RUN_DIR`); unset = the run's own (NFT and GRPO: rl.guidance; DPO and SFT: 3.0).")


# ------------------------------------------------------------------------------ every algorithm
@frozen
class RLBase:
    """The `rl` fields every algorithm has. Manifest paths stay flat (`rl.max_steps`, `rl.init_from`);
    an algorithm restates a field here only to give it its own default or doc text."""

    algorithm: str = required("The algorithm (config/algorithms.py registers the names); selects the rest of the table.")
    max_steps: int = knob(100, "Optimizer steps.")
    init_from: str = knob("", "Base weights: `model.path` itself, a weights or DCP folder, `s3://` (pulled once per node) or `preset:NAME`; empty = model.path's own weights (or the preset's).")
    init_keys_to_skip_loading: list[str] = knob(
        attrs.Factory(list), "Glob patterns (`*` crosses dots) of base-checkpoint keys the model does not build, e.g. the Nano sound and action heads `audio_*`, `action_*` (a T2I model never builds them); any other extra or missing key fails the load."
    )
    optimizer: OptimizerConfig = section(OptimizerConfig, "Optimizer of the policy.")
    eval: EvalConfig = section(EvalConfig, "Evaluation during training on held-out prompts (`eval/` metrics).")


# Resolve the string annotations once so that tools walking the tree (docs, did-you-mean) see types.
for _cls in list(globals().values()):
    if isinstance(_cls, type) and attrs.has(_cls):
        attrs.resolve_types(_cls, globals())
