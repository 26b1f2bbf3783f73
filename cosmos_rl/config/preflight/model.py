"""Preflight rules of `[model]` and the base it starts from: LoRA, the model named once
(`model.path` or `model.preset`), its folder, and `rl.init_from` agreeing with it. The frame size
and frames are `media.py`'s.
"""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path

from cosmos_rl.config.preflight.media import folder_config_rules, folder_vae_rules, frame_size
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema
from cosmos_rl.core.problems import show
from cosmos_rl.models.layout import (
    PIPELINE_INDEX,
    PRESET_SCHEME,
    S3_SCHEME,
    SCHEDULER_CONFIG,
    is_pipeline_folder,
    read_json,
    scheduler_problem,
)
from cosmos_rl.models.towers import TOWERS, target_problem


def lora_rules(lora: schema.LoraConfig, r: Rules) -> None:
    """model.lora: rank, alpha and the target modules."""
    r.at_least("model.lora.rank", lora.rank, 0)
    if lora.rank > 0:
        r.positive("model.lora.alpha", lora.alpha)
    _lora_targets(lora.target_modules, r)


def _lora_targets(names: list[str], r: Rules) -> None:
    for index, name in enumerate(names):
        problem = target_problem(name)
        if problem is not None:
            near = difflib.get_close_matches(str(name), list(TOWERS), n=1)
            fix = f'did you mean "{near[0]}"?' if near else f"use a tower name ({', '.join(TOWERS)}) or a module name such as to_q or add_q_proj"
            r.error(f"model.lora.target_modules[{index}]", problem, name, fix)
        elif name not in TOWERS and difflib.get_close_matches(name, list(TOWERS), n=1, cutoff=0.8):
            near = difflib.get_close_matches(name, list(TOWERS), n=1, cutoff=0.8)[0]
            r.error(f"model.lora.target_modules[{index}]", f"{name!r} is no module of a Cosmos3 layer and is one letter or two from the tower name {near!r}", name, f'did you mean "{near}"?')
    if len(set(names)) != len(names):
        r.error("model.lora.target_modules", "names an entry twice", list(names), "list each name once")


def _model_folder(value: str, r: Rules) -> Path | None:
    folder = r.local_path("model.path", value, kind="folder")
    if folder is None:
        return None
    if not ((folder / PIPELINE_INDEX).is_file() or (folder / "transformer").is_dir()):
        r.error("model.path", "not a diffusers folder (no model_index.json or transformer/)", value, "point it at a folder written by save_pretrained")
        return None
    scheduler = folder / SCHEDULER_CONFIG
    if not scheduler.is_file():
        r.error("model.path", "has no scheduler/scheduler_config.json, so the sampler is unknown", value,
                "point it at the whole pipeline folder (save_pretrained writes scheduler/)")
        return folder
    try:
        problem = scheduler_problem(read_json(scheduler, str(scheduler)))
    except ValueError as exc:
        problem = str(exc)
    if problem:
        r.error("model.path", f"scheduler/scheduler_config.json {problem}", value, "Cosmos3 samples with flow UniPC; use the pipeline's own scheduler folder")
    return folder


def _pipeline_base_conflict(base: Path, folder: Path | None, model: schema.ModelConfig) -> str | None:
    """How a whole-pipeline base contradicts the named model (None when it does not)."""
    if not is_pipeline_folder(base):
        return None  # a weights or DCP base goes into whatever architecture the model names
    if folder is not None and base.resolve() != folder.resolve():
        return f"model.path is {show(model.path)}"
    if not model.path and model.preset is not None:
        return f"the model is model.preset = {show(model.preset)}"
    return None


def base_rules(c: schema.RunConfig, r: Rules) -> None:
    """The model is named once (model.path or model.preset), rl.init_from agrees with it, and
    rl.init_keys_to_skip_loading skips keys of a checkpoint that is loaded."""
    model, value = c.model, c.rl.init_from
    if not model.path and model.preset is None:
        r.error("model.path", "no model named: set a local diffusers folder here, or model.preset to a built-in preset", "",
                'set model.path = "/path/to/cosmos3-nano" (or model.preset = "tiny" for the CPU smoke model)')
    elif model.path and model.preset is not None:
        r.error("model.preset", "given together with model.path; the model is either a folder or a built-in preset", model.preset,
                "remove model.preset (the folder brings its architecture) or model.path")
    folder = _model_folder(model.path, r) if model.path else None
    if folder is not None:
        folder_config_rules(folder, r)
        folder_vae_rules(model, folder, frame_size(model), r)

    known = typing.get_args(schema.PresetName)
    if value.startswith(PRESET_SCHEME):
        name = value[len(PRESET_SCHEME):]
        if name not in known:
            r.error("rl.init_from", "unknown preset", value, f"use one of {', '.join(PRESET_SCHEME + k for k in known)}")
        elif model.path:
            r.error("rl.init_from", "names a built-in preset's random weights while model.path names a folder", value,
                    "set rl.init_from to the folder (or a checkpoint of it), or replace model.path by model.preset")
    elif value.startswith(S3_SCHEME):
        if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{2,62}(/.*)?", value):
            r.error("rl.init_from", "not a valid s3:// URL", value, "write s3://bucket/prefix")
    elif "://" in value:
        r.error("rl.init_from", "unsupported URL scheme", value, "use a local folder or s3://bucket/prefix")
    elif value:
        base = r.local_path("rl.init_from", value, kind="folder")
        named = _pipeline_base_conflict(base, folder, model) if base is not None else None
        if named:
            r.error("rl.init_from", f"is a diffusers pipeline folder, which brings its own architecture, VAE, tokenizer and scheduler, but {named}",
                    value, "set model.path to the same folder (and drop model.preset), or point rl.init_from at its transformer/ subfolder to take only its weights")

    nothing_loaded = not model.path and model.preset is not None and (value == "" or value.startswith(PRESET_SCHEME))
    if nothing_loaded and c.rl.init_keys_to_skip_loading:
        r.error("rl.init_keys_to_skip_loading", "no checkpoint is loaded (the built-in preset's weights are random), so nothing can be skipped",
                c.rl.init_keys_to_skip_loading, "remove it, or set rl.init_from / model.path to the checkpoint it applies to")
    for i, key in enumerate(c.rl.init_keys_to_skip_loading):
        if not key.strip():
            r.error(f"rl.init_keys_to_skip_loading[{i}]", "empty key pattern", key, "remove it")
