"""What `cosmos-rl eval TARGET` evaluates: a run directory (its newest checkpoint and its base) or a model.

A run directory (it holds `manifest.toml`) is rebuilt from its saved manifest exactly as the
trainer builds it (`models.setup.build_trainable`: the base `rl.init_from` names plus the policy
adapter, or all weights for a full fine-tune), then its newest committed checkpoint's `policy`
component is loaded into it (`checkpoint.CheckpointManager.load`, which checks the files and the
run identity first); that component has the one format of `checkpoint.policy`, whichever
algorithm wrote it. The base for comparison is the same network with adapters disabled (or the
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

from cosmos_rl.errors import UserError
from cosmos_rl.config.sampler import SamplerSettings, default_settings, run_settings

if TYPE_CHECKING:
    import torch

PRESET = "preset:"
DEFAULT_IMAGE_SIZE = 32  # a bare model's image side unless --image-size says otherwise (the shapes world's)


@dataclass
class Target:
    label: str  # what the user passed
    kind: str  # "run" or "model"
    parts: Any  # .transformer, .vae, .tokenizer
    settings: SamplerSettings
    image_size: int
    out_dir: Path  # where the grid and eval.json go
    step: int | None  # the checkpoint's step (runs only)
    policy: Callable[[], ContextManager[torch.nn.Module]]
    base: Callable[[], ContextManager[torch.nn.Module]] | None
    train_prompts: list[str] | None  # what the run trained on, when it has a prompt list (NFT)
    config: Any = None  # a run's saved manifest (schema.RunConfig); None for a model


def target_kind(text: str) -> str:
    """"run" or "model", from files and names only (no torch), or a UserError saying what TARGET may be."""
    if text.startswith(PRESET):
        import typing

        from cosmos_rl.config.schema import PresetName

        known = typing.get_args(PresetName)
        if text[len(PRESET):] not in known:
            raise UserError(f"TARGET {text!r}: unknown preset {text[len(PRESET):]!r}; known presets: {', '.join(PRESET + p for p in known)}")
        return "model"
    path = Path(text)
    if (path / "manifest.toml").is_file():
        return "run"
    if not path.is_dir():
        raise UserError(
            f"TARGET {text!r}: no such folder; pass a run directory (holds manifest.toml), a diffusers "
            "model folder (holds transformer/, vae/, tokenizer/, scheduler/) or preset:NAME"
        )
    if not (path / "transformer").is_dir():
        raise UserError(
            f"TARGET {text!r}: neither a run directory (no manifest.toml) nor a diffusers model folder "
            "(no transformer/); pass the folder `cosmos-rl train` created, or a model folder"
        )
    return "model"


def open_target(
    text: str, device: torch.device, image_size: int | None, out_dir: Path | None, step: int | None = None
) -> Target:
    """The target `text` names; `step` picks a run's committed checkpoint (None: the newest)."""
    if target_kind(text) == "run":
        return _open_run(Path(text), device, image_size, out_dir, step)  # it checks the step itself
    check_step(text, step)
    return _open_model(text, device, image_size or DEFAULT_IMAGE_SIZE, out_dir)


def check_step(text: str, step: int | None) -> None:
    """Refuse a `--step` the target cannot honour before any model loads or any file is written."""
    if step is None:
        return
    if target_kind(text) == "model":
        raise UserError(f"--step {step}: TARGET {text!r} is a model, which has no checkpoints; drop --step (it is for run directories)")
    _pick_step(Path(text), step)


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


def _open_run(run_dir: Path, device: torch.device, image_size: int | None, out_dir: Path | None, step: int | None) -> Target:
    from cosmos_rl import plan
    from cosmos_rl.checkpoint import CheckpointManager, layout
    from cosmos_rl.checkpoint.policy import policy_component
    from cosmos_rl.config import algorithms, load
    from cosmos_rl.models.setup import build_trainable

    config = load.load(run_dir / "manifest.toml", saved_run=True)
    if image_size is not None and image_size != config.model.image_size:
        raise UserError(
            f"--image-size {image_size}: the run {run_dir} trains at model.image_size = {config.model.image_size}; "
            "drop --image-size (it is for bare models)"
        )
    step = _pick_step(run_dir, step)
    manager = CheckpointManager(run_dir, 0, run_identity=plan.run_identity(config), algorithm=config.rl.algorithm)
    entry = algorithms.of(config)
    if entry.trained_part(config.rl) == "vae":
        return _open_vae_run(run_dir, config, manager, step, device, out_dir)
    model = build_trainable(config, device, adapter_names=("policy",))
    manager.load(step, {layout.POLICY: policy_component(model.state_module(), lora=model.lora)})
    model.transformer.eval()

    @contextmanager
    def base():
        with model.reference() as reference:
            yield reference

    prompts_of = entry.resolve("train_prompts")
    train_prompts = prompts_of(config.rl) if prompts_of is not None else None
    return Target(
        label=str(run_dir), kind="run", parts=model, settings=run_settings(config), image_size=config.model.image_size,
        out_dir=Path(out_dir) if out_dir is not None else run_dir / "eval", step=step,
        policy=lambda: nullcontext(model.transformer), base=base, train_prompts=train_prompts, config=config,
    )


def _open_vae_run(run_dir: Path, config, manager, step: int, device: torch.device, out_dir: Path | None) -> Target:
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

    return Target(
        label=str(run_dir), kind="run", parts=parts, settings=run_settings(config), image_size=config.model.image_size,
        out_dir=Path(out_dir) if out_dir is not None else run_dir / "eval", step=step,
        policy=lambda: decoded_by(trained_weights), base=lambda: decoded_by(base_weights), train_prompts=None,
        config=config,
    )


def _open_model(text: str, device: torch.device, image_size: int, out_dir: Path | None) -> Target:
    from cosmos_rl.models.build import build_preset, load_parts

    if text.startswith(PRESET):
        name = text[len(PRESET):]
        parts, label = build_preset(name, seed=0), f"preset_{name}"
    else:
        parts, label = load_parts(Path(text)), Path(text).resolve().name
    parts.vae.to(device)
    parts.transformer.to(device)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", label)
    return Target(
        label=text, kind="model", parts=parts, settings=default_settings(), image_size=image_size,
        out_dir=Path(out_dir) if out_dir is not None else Path("eval") / safe, step=None,
        policy=lambda: nullcontext(parts.transformer), base=None, train_prompts=None,
    )
