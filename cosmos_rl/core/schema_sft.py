"""The SFT table (`rl.algorithm = "sft"`): what trains, the VAE stage's loss weights, and the
image-caption (or clip, or LeRobot window) source. Declared as `core.schema` declares the rest;
`core.schema` re-exports every class, so `schema.SFTConfig` is where callers find it."""

from __future__ import annotations

from typing import Literal

import attrs

from cosmos_rl.core.schema_common import OptimizerConfig, RLBase, frozen, knob, required, section


@frozen
class CaptionDataConfig:
    shards: list[str] = knob(
        attrs.Factory(list),
        "webdataset tar shards of image-caption samples (one `png`/`jpg`/`jpeg`/`webp` image, the caption in `txt` or in `json` as `caption` or `prompt`; a video run: one `mp4` clip instead of the image, docs/video.md); entries may be brace patterns.",
    )
    jsonl: str = knob("", "Image-caption JSONL: rows `{\"image\": path, \"caption\": text}` (`prompt` is read for `caption`; optional `id`; a video run: `\"video\": path` to an mp4 clip instead of `image`); paths relative to the file.")
    lerobot: str = knob(
        "",
        "A LeRobot-format dataset folder (`meta/info.json`, parquet tables, mp4 videos; docs/world.md): every window of "
        "model.num_frames frames of every episode, with its model.num_frames - 1 actions and the episode's task as the "
        "description, for an action-mode `model.condition.kind` (the world model).",
    )
    camera: str = knob("", "`lerobot`: the video key the frames are read from (e.g. `observation.image`); empty = the dataset's only one.")
    shuffle: bool = knob(True, "Shuffle sample order each epoch (seeded from job.seed).")


@frozen
class PixelWeightsConfig:
    suite: str = knob(
        "",
        "`vae`: the suite whose verifier classes the pixels (a built-in name, `pusht`, or `package.module:SUITE`; it must define "
        "`pixel_classes`: Push-T's are `agent` and `block`, the palette rule its verifier counts pixels by). Empty = no class weights "
        "(classes and miss unused).",
    )
    classes: dict[str, float] = knob(
        attrs.Factory(dict),
        "`vae`: weight (>= 1) of the truth frame's pixels of each named class, the class grown by one pixel, in place of "
        "rl.foreground_weight's weight there, e.g. `{agent = 30}`: Push-T's disc is 2-4 of 1,024 pixels at 32 x 32 and the "
        "foreground weight alone leaves it to the T's blur (docs/studies/2026-12-07-pusht-vae.md). Empty = none.",
    )
    miss: float = knob(
        1.0,
        "`vae`: weight (>= 1) of every pixel the verifier classes differently in the decoded frame than in the truth (a faint "
        "blue tint the verifier counts as the agent, a disc drawn in no palette colour), at least the weights above; squared "
        "error alone barely sees a 2-pixel disc, the verdict does. 1 = off.",
    )


@frozen
class SFTConfig(RLBase):
    algorithm: Literal["sft"] = required("`sft` selects supervised flow matching on image-caption data.")
    train: Literal["transformer", "vae"] = knob(
        "transformer",
        "What trains: `transformer` (flow matching on the frozen VAE's latents) or `vae` (the VAE as an autoencoder: pixel MSE of the decoded posterior mean; needs model.lora.rank = 0).",
    )
    foreground_weight: float = knob(
        1.0,
        "`vae`: weight of foreground pixels (those whose colour differs from their frame's per-channel median) in the reconstruction MSE, against 1 for the rest; above 1 keeps a VAE trained on plain-background data (the shapes worlds) from settling on the background. 1 = plain MSE.",
    )
    unclamped_loss: bool = knob(
        False,
        "`vae`: compare the decoder's output before its clamp to [-1, 1] (the reconstruction is clamped only when used), so pixels the VAE overshoots still get a gradient; needed when a VAE made on dark frames trains on light ones (the Push-T base). false = the clamped output, what the shapes bases trained on.",
    )
    max_steps: int = knob(1000, "Optimizer steps.")
    samples_per_step: int = knob(32, "Image-caption samples per optimizer step, split evenly over the ranks.")
    caption_dropout: float = knob(
        0.1, "`transformer`: chance that a sample trains with the empty prompt, which classifier-free guidance samples with."
    )
    timestep_sampling: Literal["uniform", "logit_normal"] = knob(
        "uniform", "`transformer`: how training draws each sample's flow time t: `uniform`, t ~ U[0, 1); `logit_normal`, t = sigmoid(logit_mean + logit_std * z) "
        "with z ~ N(0, 1) (flow_grpo's DPO and SD3's training: more weight on the middle times)."
    )
    logit_mean: float = knob(0.0, "`logit_normal`: the mean of t's logit (0 centres t on 0.5; flow_grpo's DPO: 0).")
    logit_std: float = knob(1.0, "`logit_normal`: the std of t's logit, > 0 (flow_grpo's DPO: 1).")
    init_from: str = knob("", "Base checkpoint: diffusers folder, DCP folder, `s3://` (pulled once) or `preset:NAME`; empty = model.*.")
    init_keys_to_skip_loading: list[str] = knob(
        attrs.Factory(list), "Glob patterns (`*` crosses dots) of base-checkpoint keys the model does not build; any other extra or missing key fails the load."
    )
    pixel_weights: PixelWeightsConfig = section(PixelWeightsConfig, "`vae`: the reconstruction loss weighted by a suite verifier's pixel classes.")
    optimizer: OptimizerConfig = section(OptimizerConfig, "Optimizer of the trained part.")
    data: CaptionDataConfig = section(CaptionDataConfig, "Training image-caption samples.")
