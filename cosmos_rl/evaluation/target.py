"""What `cosmos-rl eval`/`export`/`pairs mine` work on: a run directory (a committed checkpoint and
its base) or a model, judged once per command.

`open_target(TEXT, ...)` (a run or a model: eval, pairs mine) and `open_run(RUN_DIR, ...)` (a run
only: export) read names and files, never a model: they refuse what the command cannot honour
(an unknown preset, a folder that is neither a run nor a model, a `--step` that is not committed
or is given for a model, `--image-size` for a run) and pick the checkpoint, so a command checks
its own outputs next and only then calls `Target.load(device)`, which builds the model.

A run directory (it holds `manifest.toml`) is rebuilt from its saved manifest exactly as the
trainer builds it (`models.setup.build_trainable`: the base `rl.init_from` names plus the policy
adapter, or all weights for a full fine-tune), then the picked committed checkpoint's `policy`
component (the newest, or `--step`) is loaded into it (`checkpoint.CheckpointManager.load`, which
checks the files and the run identity first); that component has the one format of
`checkpoint.policy`, whichever algorithm wrote it (a GRPO run's moving average, `rl.ema_decay`, when
the step holds one: `checkpoint.policy.model_component`). The base for comparison is the same network with adapters disabled (or the
frozen copy of the base, for a full fine-tune): the trainer's reference. Only the policy is
loaded, never the optimizer or the old policy. An SFT run that trained the VAE keeps the base
transformer and compares the checkpoint's VAE with the base's.

A model is `preset:NAME` (built from seed 0, as a run with job.seed 0 builds it) or a diffusers
folder (`models.build.load_parts`); it has no base.
"""

from __future__ import annotations

import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from cosmos_rl.config.sampler import default_settings, folder_settings, run_settings
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.models.sampler_settings import SamplerSettings

if TYPE_CHECKING:
    import torch

PRESET = "preset:"
DEFAULT_MEDIA = MediaSpec.image(32)  # a bare model's images unless --image-size says otherwise (the shapes world's)


@dataclass
class Target:
    """A run (its saved manifest and the committed checkpoint picked) or a model, before it is loaded."""

    label: str  # what the user passed
    kind: str  # "run" or "model"
    settings: SamplerSettings
    media: MediaSpec  # what it samples: a run's model size, or a bare model's
    out_dir: Path  # where the grid and eval.json go
    step: int | None = None  # the checkpoint's step (runs only)
    config: Any = None  # a run's saved manifest (schema.RunConfig); None for a model

    def load(self, device: torch.device, heads: bool = False) -> Model:
        """Build the model (a run: its network with the checkpoint's `policy` loaded) on `device`;
        `heads`: a model folder's transformer with every head its config declares (the action
        heads a world model's evaluation samples with), else without (text to image or video)."""
        if self.kind == "run":
            return _load_run(Path(self.label), self.config, self.step, device)
        return _load_model(self.label, device, heads)

    def train_prompts(self) -> list[str] | None:
        """What the run trained on, when its algorithm walks a prompt list (NFT); None otherwise."""
        if self.config is None:
            return None
        from cosmos_rl.config import algorithms

        prompts_of = algorithms.of(self.config).resolve("train_prompts")
        return prompts_of(self.config.rl) if prompts_of is not None else None


@dataclass
class Model:
    """A loaded target: what samples (`policy`) and, for a run, what it is compared with (`base`)."""

    parts: Any  # .transformer, .vae, .tokenizer (a run's models.setup.TrainableModel, or ModelParts)
    policy: Callable[[], ContextManager[torch.nn.Module]]
    base: Callable[[], ContextManager[torch.nn.Module]] | None

    @property
    def model_parts(self):
        """The models.build.ModelParts (scheduler, tokenizer, prompt template) behind `parts`."""
        return getattr(self.parts, "parts", self.parts)


def target_media(text: str, image_size: int | None, frames: int | None) -> MediaSpec | None:
    """What a bare model samples from `--image-size` / `--frames`: a preset's own media
    (`models.architectures.PRESET_MEDIA`) where they are not given, else 32 px images. None when
    neither is given for anything else (a run samples its own; a folder the default)."""
    from cosmos_rl.models.architectures import PRESET_MEDIA

    own = PRESET_MEDIA.get(text[len(PRESET):]) if text.startswith(PRESET) else None
    if own is None and image_size is None and frames is None:
        return None
    default_frames, default_side = own or (DEFAULT_MEDIA.frames, DEFAULT_MEDIA.height)
    side = image_size if image_size is not None else default_side
    return MediaSpec(frames=frames if frames is not None else default_frames, height=side, width=side)


def open_target(
    text: str, *, step: int | None = None, media: MediaSpec | None = None, out_dir: Path | None = None, frames: int | None = None
) -> Target:
    """The run or model `text` names; `step` picks a run's committed checkpoint (None: the newest);
    `media` is what a bare model samples (`--image-size`; None: DEFAULT_MEDIA), a run samples its own.
    Refuses what cannot be honoured (a UserError) before anything loads; torch-free."""
    if text.startswith(PRESET):
        import typing

        from cosmos_rl.core.schema import PresetName

        known = typing.get_args(PresetName)
        if text[len(PRESET):] not in known:
            raise UserError(f"TARGET {text!r}: unknown preset {text[len(PRESET):]!r}; known presets: {', '.join(PRESET + p for p in known)}")
        return _model_target(text, step, media, out_dir, f"preset_{text[len(PRESET):]}")
    path = Path(text)
    if (path / "manifest.toml").is_file():
        return _run_target(path, step, media, out_dir, frames)
    if not path.is_dir():
        raise UserError(
            f"TARGET {text!r}: no such folder; pass a run directory (holds manifest.toml), a diffusers "
            "model folder (holds transformer/, vae/, text_tokenizer/, scheduler/, as `cosmos-rl export` writes it) or preset:NAME"
        )
    if not (path / "transformer").is_dir():
        raise UserError(
            f"TARGET {text!r}: neither a run directory (no manifest.toml) nor a diffusers model folder "
            "(no transformer/); pass the folder `cosmos-rl train` created, or a model folder"
        )
    return _model_target(text, step, media, out_dir, path.resolve().name)


def open_run(run_dir: str, *, step: int | None = None) -> Target:
    """`open_target` for a command that takes only a run directory (export)."""
    if not (Path(run_dir) / "manifest.toml").is_file():
        raise UserError(f"RUN_DIR {run_dir!r}: not a run directory (no manifest.toml); pass the folder `cosmos-rl train` created")
    return _run_target(Path(run_dir), step, None, None)


def _model_target(text: str, step: int | None, media: MediaSpec | None, out_dir: Path | None, label: str) -> Target:
    if step is not None:
        raise UserError(f"--step {step}: TARGET {text!r} is a model, which has no checkpoints; drop --step (it is for run directories)")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", label)
    _judge_media(text, media or DEFAULT_MEDIA)  # before anything loads: validate's rules for model.path
    # A folder `cosmos-rl export` wrote samples as its run was evaluated (its cosmos_rl.json).
    settings = default_settings() if text.startswith(PRESET) else folder_settings(Path(text))
    return Target(
        label=text, kind="model", settings=settings, media=media or DEFAULT_MEDIA,
        out_dir=Path(out_dir) if out_dir is not None else Path("eval") / safe,
    )


def _judge_media(text: str, media: MediaSpec) -> None:
    """Refuse a bare model's media its VAE cannot make, and a folder `validate` would refuse as
    model.path: its configs past the bounds a load holds them to, a frame size its VAE cannot
    divide, and (for clips) a `scale_factor_temporal` its stages contradict. The same rules as
    `config.preflight.media` (torch-free, bounded JSON), named by the options that set them."""
    from types import SimpleNamespace

    from cosmos_rl.config.preflight.media import folder_config_rules, folder_vae_rules
    from cosmos_rl.config.preflight.rules import Rules
    from cosmos_rl.core.media import vae_spatial_factor

    options = {"model.path": f"TARGET {text!r}", "model.height": "--image-size", "model.width": "--image-size", "model.image_size": "--image-size"}
    if text.startswith(PRESET):
        from cosmos_rl.models.architectures import PRESET_ARCHITECTURES

        spatial = vae_spatial_factor(PRESET_ARCHITECTURES[text[len(PRESET):]][1])
        if media.height % spatial or media.width % spatial:
            raise UserError(f"--image-size: {media.height} is not a multiple of {text}'s {spatial}-pixel latent cell; use a multiple of {spatial}")
        return
    rules = Rules(Path(text))
    folder_config_rules(Path(text), rules)
    folder_vae_rules(SimpleNamespace(num_frames=media.frames, image_size=None), Path(text), (media.height, media.width), rules)
    for problem in rules.problems:
        if problem.severity == "error":
            line = problem.render()
            raise UserError(options.get(problem.path, problem.path) + line[len(problem.path):])


def _run_target(run_dir: Path, step: int | None, media: MediaSpec | None, out_dir: Path | None, frames: int | None = None) -> Target:
    from cosmos_rl.config import load

    step = _pick_step(run_dir, step)
    config = load.load(run_dir / "manifest.toml", saved_run=True)
    trained = MediaSpec.from_model_config(config.model)
    if frames is not None and frames != trained.frames:  # first: --frames alone also makes a bare model's `media`
        raise UserError(f"--frames {frames}: the run {run_dir} trains at model.num_frames = {trained.frames}; drop --frames (it is for bare models)")
    if media is not None and media.size != trained.size:
        raise UserError(
            f"--image-size {media.size_json()}: the run {run_dir} trains at "
            + (f"model.image_size = {trained.height}" if trained.height == trained.width
               else f"model.height x model.width = {trained.height}x{trained.width}")
            + "; drop --image-size (it is for bare models)"
        )
    return Target(
        label=str(run_dir), kind="run", settings=run_settings(config), media=trained,
        out_dir=Path(out_dir) if out_dir is not None else run_dir / "eval", step=step, config=config,
    )


def _pick_step(run_dir: Path, step: int | None) -> int:
    """The committed checkpoint to open: `step`, or the newest when None."""
    from cosmos_rl.checkpoint import layout

    committed = layout.committed_steps(layout.checkpoints_root(run_dir))
    if not committed:
        raise UserError(
            f"{run_dir}: no committed checkpoint yet (checkpoints are committed every checkpoint.every "
            "steps and at the last one); wait for one (to score the base instead, evaluate the base model)"
        )
    if step is None:
        return committed[-1]
    if step not in committed:
        raise UserError(f"--step {step}: {run_dir} has no committed checkpoint at that step; committed: {', '.join(map(str, committed))}")
    return step


def _load_run(run_dir: Path, config, step: int, device: torch.device) -> Model:
    from cosmos_rl.planning import plan
    from cosmos_rl.checkpoint import CheckpointManager
    from cosmos_rl.checkpoint.policy import model_component
    from cosmos_rl.config import algorithms
    from cosmos_rl.models.setup import build_trainable

    manager = CheckpointManager(run_dir, 0, run_identity=plan.run_identity(config), algorithm=config.rl.algorithm)
    if algorithms.of(config).trained_part(config.rl) == "vae":
        return _load_vae_run(config, manager, step, device)
    model = build_trainable(config, device, adapter_names=("policy",))
    stored = manager.read_meta(step).get("components", {})
    manager.load(step, dict([model_component(model.state_module(), lora=model.lora, stored=stored)]))
    model.transformer.eval()

    @contextmanager
    def base():
        with model.reference() as reference:
            yield reference

    return Model(parts=model, policy=lambda: nullcontext(model.transformer), base=base)


def _load_vae_run(config, manager, step: int, device: torch.device) -> Model:
    """An SFT run that trained the VAE: the base transformer samples both times; the checkpoint's VAE
    decodes the policy's images and the base's own VAE the base's (the evaluator holds one VAE
    module, so each side loads its weights into it)."""
    import torch

    from cosmos_rl.checkpoint import layout
    from cosmos_rl.checkpoint.policy import policy_component
    from cosmos_rl.models.setup import load_base

    parts = load_base(config)
    parts.transformer.to(device).eval()
    vae = parts.vae.to(device).eval()
    base_weights = {k: v.clone() for k, v in vae.state_dict().items()}
    manager.load(step, {layout.POLICY: policy_component(vae, lora=False)})
    trained_weights = {k: v.clone() for k, v in vae.state_dict().items()}

    @contextmanager
    def decoded_by(weights):
        with torch.no_grad():
            vae.load_state_dict(weights)
        try:
            yield parts.transformer
        finally:
            with torch.no_grad():
                vae.load_state_dict(trained_weights)

    return Model(parts=parts, policy=lambda: decoded_by(trained_weights), base=lambda: decoded_by(base_weights))


def _load_model(text: str, device: torch.device, heads: bool = False) -> Model:
    from cosmos_rl.models.build import build_preset, load_parts

    parts = build_preset(text[len(PRESET):], seed=0) if text.startswith(PRESET) else load_parts(Path(text), heads=heads)
    parts.vae.to(device)
    parts.transformer.to(device)
    return Model(parts=parts, policy=lambda: nullcontext(parts.transformer), base=None)
