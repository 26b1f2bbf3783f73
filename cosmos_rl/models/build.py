"""Build, save and load the four parts of a Cosmos3 text-to-image model.

A model is either a named preset (`tiny`: random weights built from a seed, for tests and CPU
smoke runs; `shapes`: the pretrained shapes-world base shipped in the package, see
`shapes/preset.py`) or a local diffusers-style folder with `transformer/`, `vae/`, `tokenizer/` (or
`text_tokenizer/`), `scheduler/` subfolders, e.g. a Cosmos3-Nano pipeline folder. A folder's
model is built for text-to-image: without the sound and action heads its transformer config may
enable. Nothing is ever fetched from a hub, and nothing a folder's configs ask for is allocated
before `models.folder_check` has matched them against the folder's weights.

A model also names its prompt template (`models/text.py`): `chat` (the pipeline's, and what a
folder without `cosmos_rl.json` uses) or `minimal`. `save_parts` writes it to
`<folder>/cosmos_rl.json` so a model saved and loaded again is tokenized the same way.
"""

from __future__ import annotations

import copy
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer, UniPCMultistepScheduler
from transformers import PreTrainedTokenizerFast

from cosmos_rl.checkpoint.weight_files import FolderProblem, read_config
from cosmos_rl.core.errors import UserError, library_text
from cosmos_rl.core.files import MAX_METADATA_BYTES, read_user_json
from cosmos_rl.models import folder_check
from cosmos_rl.models.architectures import TINY_TRANSFORMER, TINY_VAE
from cosmos_rl.models.layout import MODEL_INFO, PIPELINE_INDEX, PRESET_FLOW_SHIFT, scheduler_problem
from cosmos_rl.models.text import PROMPT_TEMPLATES
from cosmos_rl.models.tokenizer import build_tiny_tokenizer

COMPONENTS = ("transformer", "vae", "tokenizer", "scheduler")

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
    # The pipeline's `use_native_flow_schedule` (model_index.json): explicit linear sigmas.
    native_flow_schedule: bool = False
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
    return Cosmos3OmniTransformer(**copy.deepcopy(TINY_TRANSFORMER), vocab_size=vocab_size, **extra_heads)


def _tiny_vae() -> AutoencoderKLWan:
    return AutoencoderKLWan(**copy.deepcopy(TINY_VAE))


def _build_tiny(with_extra_heads: bool) -> ModelParts:
    tokenizer = build_tiny_tokenizer()
    # VAE first: the transformer creates its optional heads last, so with or without them every
    # shared weight (VAE included) draws the same random numbers.
    vae = _tiny_vae()
    transformer = _tiny_transformer(len(tokenizer), with_extra_heads)
    return ModelParts(
        transformer=transformer, vae=vae, tokenizer=tokenizer, scheduler=flow_scheduler(PRESET_FLOW_SHIFT["tiny"])
    )


# name -> its builder, called with `with_extra_heads`. A preset owned by another package is named
# by "module:function", imported on first use, so this module imports none of them (the shapes
# base lives with the shapes world, which builds on models/).
PRESETS: dict[str, Callable[[bool], ModelParts] | str] = {
    "tiny": _build_tiny,
    "shapes": "cosmos_rl.models.shapes_preset:build_shapes",
    "shapes_video": "cosmos_rl.models.shapes_video_preset:build_shapes_video",
    "pusht": "cosmos_rl.models.pusht_preset:build_pusht",
}


def _preset_builder(name: str) -> Callable[[bool], ModelParts]:
    builder = PRESETS[name]
    if isinstance(builder, str):
        module, _, function = builder.partition(":")
        builder = getattr(importlib.import_module(module), function)
    return builder


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
        parts = _preset_builder(name)(with_extra_heads)
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
    # Unreadable, damaged or nested past the parser: core.files names the file and the fix in one line.
    data = read_user_json(info, "model.path", MODEL_INFO, MAX_METADATA_BYTES)
    if not isinstance(data, dict):
        raise UserError(f"model.path: {str(info)!r} is not a JSON object; write it again with save_parts or delete it")
    template = data.get("prompt_template", "chat")
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


def _refuse_pickled_only(sub: Path) -> None:
    """A pickled `.bin` would run code on load, so a part that has only those is refused."""
    if not any(sub.glob("*.safetensors")) and not any(sub.glob("*.safetensors.index.json")):
        pickled = sorted(p.name for p in sub.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".ckpt"})
        raise UserError(
            f"model.path: {str(sub)!r} has no *.safetensors weights"
            + (f" (found pickled {pickled}, which are never loaded: they could run code)" if pickled else "")
            + ". Convert the weights to safetensors (diffusers: save_pretrained(..., safe_serialization=True))."
        )


# Transformer config switch -> the glob of the head weights it adds (the public manifests' skip list).
HEAD_SWITCHES = {"sound_gen": "audio_*", "action_gen": "action_*"}


def t2i_transformer_config(config: dict) -> dict:
    """The folder's transformer config without the sound and action heads: a text-to-image run
    never builds them, so a Cosmos3-Nano checkpoint's head weights are base keys the model does not
    build (dropped only where rl.init_keys_to_skip_loading lists them)."""
    return {**config, **{switch: False for switch in HEAD_SWITCHES}}


def declared_heads(config: dict) -> list[str]:
    """Skip patterns for exactly the heads a transformer config turns on (e.g. a Nano folder's)."""
    return [pattern for switch, pattern in HEAD_SWITCHES.items() if config.get(switch)]


def _pipeline_options(folder: Path) -> bool:
    """The pipeline settings a folder's model_index.json fixes; returns use_native_flow_schedule."""
    index = folder / PIPELINE_INDEX
    if not index.is_file():
        return False
    try:
        options = read_config(index, PIPELINE_INDEX)
    except FolderProblem as exc:
        raise UserError(f"model.path: {exc}") from None
    if not options.get("default_use_system_prompt", True):
        raise UserError(
            f"model.path: {index} sets default_use_system_prompt = false; this release tokenizes prompts "
            "with the Cosmos3 system prompt (as Cosmos3-Nano does), so its rollouts would not be the "
            "pipeline's. Use a folder whose pipeline keeps the system prompt."
        )
    return bool(options.get("use_native_flow_schedule", False))


def _scheduler_config(folder: Path, transformer_config: dict) -> dict:
    sub = _component_folder(folder, "scheduler")
    path = sub / "scheduler_config.json"
    try:
        config = read_config(path, "scheduler_config.json")
    except FolderProblem as exc:
        raise UserError(f"model.path: {exc}") from None
    problem = scheduler_problem(config)
    if problem:
        raise UserError(f"model.path: {path} {problem}; Cosmos3 samples with flow UniPC")
    folder_check.check_scheduler(path, config, transformer_config)
    return config


def _load_tokenizer(folder: Path, transformer_config: dict, transformer_folder: Path) -> PreTrainedTokenizerFast:
    sub = _tokenizer_folder(folder)
    folder_check.check_tokenizer_files(sub)
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(sub, local_files_only=True)
    except Exception as exc:  # the tokenizers library's refusal of the file, whatever its type
        raise UserError(f"model.path: {str(sub)!r} is not a loadable tokenizer ({library_text(exc)}); save it again with save_pretrained") from None
    folder_check.check_vocabulary(sub, len(tokenizer), transformer_config, transformer_folder)
    return tokenizer


def load_parts(
    folder: str | Path, *, skip_keys: list[str] | tuple[str, ...] | None = None, weights: bool = True,
    heads: bool = False,
) -> ModelParts:
    """Read a model from a local folder, offline; a missing folder or part raises UserError.

    The transformer is built from the folder's config without the sound/action heads
    (`t2i_transformer_config`), or with every head the config declares when `heads` (video NFT,
    whose rl.init_keys_to_skip_loading is empty: the base loads whole, heads present and unused).
    `weights=True` loads the folder's own transformer weights,
    strictly: base keys the model does not build must match a `skip_keys` glob (None: the globs
    of the heads the folder's config declares; a run passes rl.init_keys_to_skip_loading). With
    `weights=False` the transformer keeps its random init, for a caller that loads a base next.

    Every part is judged before any is built (`models.folder_check`): configs within bounds and
    building exactly the tensors the weights' headers declare, so nothing a config asks for is
    allocated unless the folder's files hold it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(
            f"model.path: folder {str(folder)!r} does not exist. "
            "Set model.path to a local model folder, or set model.preset instead."
        )
    native_flow_schedule = _pipeline_options(folder)
    sub = _component_folder(folder, "transformer")
    _refuse_pickled_only(sub)
    built = (lambda c: c) if heads else t2i_transformer_config
    config = folder_check.check_transformer(sub, built)
    vae_folder = _component_folder(folder, "vae")
    _refuse_pickled_only(vae_folder)
    folder_check.check_vae(vae_folder)
    tokenizer = _load_tokenizer(folder, config, sub)
    scheduler_config = _scheduler_config(folder, config)
    prompt_template = read_prompt_template(folder)

    transformer = Cosmos3OmniTransformer.from_config(built(config))
    if weights:
        from cosmos_rl.models.base_checkpoint import load_base_weights

        skip = (declared_heads(config) if not heads else []) if skip_keys is None else list(skip_keys)
        load_base_weights(transformer, sub, skip, shown_as=str(folder), setting="model.path")
    vae = AutoencoderKLWan.from_pretrained(vae_folder, local_files_only=True, use_safetensors=True)
    scheduler = UniPCMultistepScheduler.from_config(scheduler_config)
    transformer.eval()
    vae.eval()
    return ModelParts(
        transformer=transformer, vae=vae, tokenizer=tokenizer, scheduler=scheduler,
        native_flow_schedule=native_flow_schedule, prompt_template=prompt_template,
    )  # fmt: skip
