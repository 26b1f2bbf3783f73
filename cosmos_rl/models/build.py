"""Build, save and load the four parts of a Cosmos3 text-to-image model.

A model is either a named preset (`tiny`: random weights built from a seed, for tests and CPU
smoke runs; `shapes`: the pretrained shapes-world base shipped in the package, see
`models/shapes_preset.py`) or a local diffusers-style folder with `transformer/`, `vae/`,
`tokenizer/`, `scheduler/` subfolders. Nothing is ever fetched from a hub.

A model also names its prompt template (`models/text.py`): `chat` (the pipeline's, and what a
folder without `cosmos_rl.json` uses) or `minimal`. `save_parts` writes it to
`<folder>/cosmos_rl.json` so a model saved and loaded again is tokenized the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer, UniPCMultistepScheduler
from transformers import PreTrainedTokenizerFast

from cosmos_rl.errors import UserError
from cosmos_rl.models.text import PROMPT_TEMPLATES
from cosmos_rl.models.tokenizer import build_tiny_tokenizer

COMPONENTS = ("transformer", "vae", "tokenizer", "scheduler")
MODEL_INFO = "cosmos_rl.json"  # {"prompt_template": ...}, written by save_parts

# Key prefixes of the heads a Cosmos3-Nano checkpoint carries beyond what text-to-image builds.
SOUND_HEAD_PREFIXES = ("audio_proj_in.", "audio_proj_out.", "audio_modality_embed")
ACTION_HEAD_PREFIXES = ("action_proj_in.", "action_proj_out.", "action_modality_embed")
EXTRA_HEAD_PREFIXES = SOUND_HEAD_PREFIXES + ACTION_HEAD_PREFIXES


@dataclass
class ModelParts:
    """Everything a trainer needs from a model: the network, its VAE, tokenizer and sampler."""

    transformer: Cosmos3OmniTransformer
    vae: AutoencoderKLWan
    tokenizer: PreTrainedTokenizerFast
    scheduler: UniPCMultistepScheduler
    prompt_template: str = "chat"  # one of models.text.PROMPT_TEMPLATES


def flow_scheduler(shift: float = 1.0) -> UniPCMultistepScheduler:
    """UniPC in flow mode: the model predicts v = noise - x0 and sigmas follow the shifted flow schedule."""
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift
    )


def _tiny_transformer(vocab_size: int, with_extra_heads: bool) -> Cosmos3OmniTransformer:
    extra_heads = {}
    if with_extra_heads:
        extra_heads = dict(sound_gen=True, sound_dim=8, action_gen=True, action_dim=6, num_embodiment_domains=4)
    return Cosmos3OmniTransformer(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        latent_channel=4,
        latent_patch_size=2,
        patch_latent_dim=16,  # latent_channel * patch_size**2
        rope_axes_dim=[4, 2, 2],  # sums to head_dim / 2; a wrong sum is clipped silently
        vocab_size=vocab_size,
        dtype="float32",
        **extra_heads,
    )


def _tiny_vae() -> AutoencoderKLWan:
    # 32x32 RGB -> patchify 2 (12 channels) -> one 2x downsample -> 8x8 latents with 4 channels.
    return AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False],
        patch_size=2,
        in_channels=12,
        out_channels=12,
        # Deliberately not 0/1 so a missing (de)normalisation shows up in tests.
        latents_mean=[0.1, -0.2, 0.05, 0.0],
        latents_std=[0.9, 1.1, 1.2, 0.8],
        scale_factor_spatial=4,
        scale_factor_temporal=4,
    )


def _build_tiny(with_extra_heads: bool) -> ModelParts:
    tokenizer = build_tiny_tokenizer()
    # VAE first: the transformer creates its optional heads last, so with or without them every
    # shared weight (VAE included) draws the same random numbers.
    vae = _tiny_vae()
    transformer = _tiny_transformer(len(tokenizer), with_extra_heads)
    return ModelParts(transformer=transformer, vae=vae, tokenizer=tokenizer, scheduler=flow_scheduler())


def _build_shapes(with_extra_heads: bool) -> ModelParts:
    from cosmos_rl.models.shapes_preset import load_shapes_base

    if with_extra_heads:
        raise ValueError("the shapes preset has no sound or action heads")
    return load_shapes_base()


PRESETS: dict[str, Callable[[bool], ModelParts]] = {"tiny": _build_tiny, "shapes": _build_shapes}


def build_preset(name: str, seed: int, *, with_extra_heads: bool = False) -> ModelParts:
    """Model `name`: `tiny` has random weights, identical for one seed in any process; `shapes`
    is the shipped pretrained base (the seed plays no part).

    `with_extra_heads` adds the sound and action heads of a Cosmos3-Nano checkpoint (key prefixes
    in `EXTRA_HEAD_PREFIXES`), for testing that a base checkpoint's extra keys are skipped.
    """
    if name not in PRESETS:
        raise UserError(
            f"model.preset: unknown preset {name!r}; known presets: {sorted(PRESETS)}. "
            "Set model.preset to one of them, or set model.path to a local diffusers folder."
        )
    # A private RNG stream: the weights depend only on the seed, and the caller's global RNG state
    # is left exactly as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        parts = PRESETS[name](with_extra_heads)
    parts.transformer.eval()
    parts.vae.eval()
    return parts


def save_parts(parts: ModelParts, folder: str | Path) -> Path:
    """Write each part to `<folder>/<component>/` in diffusers' own format; returns the folder."""
    folder = Path(folder)
    parts.transformer.save_pretrained(folder / "transformer")
    parts.vae.save_pretrained(folder / "vae")
    parts.tokenizer.save_pretrained(folder / "tokenizer")
    parts.scheduler.save_pretrained(folder / "scheduler")
    (folder / MODEL_INFO).write_text(json.dumps({"prompt_template": parts.prompt_template}) + "\n", encoding="utf-8")
    return folder


def read_prompt_template(folder: Path) -> str:
    """The prompt template `<folder>/cosmos_rl.json` names; `chat` when the folder has none."""
    info = Path(folder) / MODEL_INFO
    if not info.is_file():
        return "chat"
    try:
        template = json.loads(info.read_text(encoding="utf-8")).get("prompt_template", "chat")
    except (OSError, ValueError, AttributeError) as exc:
        raise UserError(f"model.path: {str(info)!r} is not a JSON object ({exc}); write it again with save_parts or delete it") from None
    if template not in PROMPT_TEMPLATES:
        raise UserError(
            f"model.path: {str(info)!r} names prompt template {template!r}; known templates: {list(PROMPT_TEMPLATES)}. "
            "Fix the file or delete it (a folder without it uses the pipeline's chat template)."
        )
    return template


def _component_folder(folder: Path, component: str) -> Path:
    sub = folder / component
    if not sub.is_dir() or not any(sub.iterdir()):
        raise UserError(
            f"model.path: {str(folder)!r} has no {component}/ subfolder (expected {list(COMPONENTS)}). "
            "Point model.path at a folder written by save_parts or a diffusers Cosmos3 pipeline folder."
        )
    return sub


def _tokenizer_folder(folder: Path) -> Path:
    # A diffusers Cosmos3OmniPipeline folder calls its tokenizer `text_tokenizer`.
    if (folder / "tokenizer").is_dir() or not (folder / "text_tokenizer").is_dir():
        return _component_folder(folder, "tokenizer")
    return folder / "text_tokenizer"


def _load_safetensors_model(cls, folder: Path, component: str):
    """A diffusers model from `<folder>/<component>/`, from safetensors weights only: a pickled
    `.bin` would run code on load, so a folder that has only those is refused."""
    sub = _component_folder(folder, component)
    if not any(sub.glob("*.safetensors")) and not any(sub.glob("*.safetensors.index.json")):
        pickled = sorted(p.name for p in sub.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".ckpt"})
        raise UserError(
            f"model.path: {str(sub)!r} has no *.safetensors weights"
            + (f" (found pickled {pickled}, which are never loaded: they could run code)" if pickled else "")
            + ". Convert the weights to safetensors (diffusers: save_pretrained(..., safe_serialization=True))."
        )
    return cls.from_pretrained(sub, local_files_only=True, use_safetensors=True)


def load_parts(folder: str | Path) -> ModelParts:
    """Read the parts from a local folder, offline; a missing folder or part raises UserError."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(
            f"model.path: folder {str(folder)!r} does not exist. "
            "Set model.path to a local model folder, or leave it empty to build model.preset."
        )
    transformer = _load_safetensors_model(Cosmos3OmniTransformer, folder, "transformer")
    vae = _load_safetensors_model(AutoencoderKLWan, folder, "vae")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(_tokenizer_folder(folder), local_files_only=True)
    scheduler = UniPCMultistepScheduler.from_pretrained(
        _component_folder(folder, "scheduler"), local_files_only=True
    )
    transformer.eval()
    vae.eval()
    return ModelParts(
        transformer=transformer, vae=vae, tokenizer=tokenizer, scheduler=scheduler,
        prompt_template=read_prompt_template(folder),
    )


def build_model(path: str, preset: str, seed: int) -> ModelParts:
    """The model a run asked for: the folder at `path`, or preset `preset` built from `seed` when path is ""."""
    if path == "":
        return build_preset(preset, seed)
    return load_parts(path)
