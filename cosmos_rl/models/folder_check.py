"""A Cosmos3 pipeline folder judged before any part of it is built (`models.build.load_parts` asks
here first, so every command that opens a folder does: train, eval, export, pairs mine).

Each part's config is read as bounded JSON and its sizes checked against `Bound`s (the generic
checks are `checkpoint.weight_files`); the transformer and the VAE are then built on the meta
device, which allocates nothing, and what they would hold is compared with the tensors the
part's safetensors headers declare. Only a folder whose configs build exactly what its weights
hold goes on to be built for real, so the memory a load takes is bounded by the files on disk,
not by a number in a config. The tokenizer's files must be there and its ids fit the
transformer's embedding; the scheduler's config must be a sane flow UniPC.

Every problem is a `UserError` starting `model.path:`, naming the file and key, what was found
and the fix.
"""

from __future__ import annotations

import math
from pathlib import Path

from cosmos_rl.checkpoint.weight_files import (
    Bound,
    FolderProblem,
    config_problem,
    folder_weight_shapes,
    meta_shapes,
    read_config,
    shape_problem,
    shown,
)
from cosmos_rl.core.errors import UserError

SETTING = "model.path"

# Sane bounds: far above any released Cosmos3 / Wan size, far below what would exhaust a host
# while the meta build runs (its time grows with the layer and block counts).
WIDTH = Bound("int", 1, 1 << 18)  # hidden sizes, head dims, channels
COUNT = Bound("int", 1, 1024)  # heads, blocks
LAYERS = Bound("int", 1, 512)
POSITIVE = Bound("float", 0, 1e12, low_open=True)

TRANSFORMER_BOUNDS = {
    "hidden_size": WIDTH, "intermediate_size": WIDTH, "head_dim": WIDTH,
    "num_attention_heads": COUNT, "num_key_value_heads": COUNT, "num_hidden_layers": LAYERS,
    "latent_channel": WIDTH, "latent_patch_size": Bound("int", 1, 64), "patch_latent_dim": WIDTH,
    "vocab_size": Bound("int", 1, 1 << 22), "base_fps": Bound("int", 1, 1000),
    "num_embodiment_domains": COUNT, "sound_dim": Bound("int", 1, 1 << 18, nullable=True),
    "action_dim": Bound("int", 1, 1 << 18, nullable=True),
    "unified_3d_mrope_temporal_modality_margin": Bound("int", 0, 1 << 24),
    # timesteps are multiplied by it and the scheduler's num_train_timesteps must be its inverse
    "timestep_scale": POSITIVE, "rope_theta": POSITIVE, "rms_norm_eps": POSITIVE, "sound_latent_fps": POSITIVE,
    "rope_axes_dim": Bound("ints", 0, 1 << 16, nullable=True, length=8),
    "attention_dropout": Bound("float", 0, 1),
}  # fmt: skip
VAE_BOUNDS = {
    "base_dim": WIDTH, "decoder_base_dim": Bound("int", 1, 1 << 18, nullable=True), "z_dim": WIDTH,
    "dim_mult": Bound("ints", 1, 64, length=16), "num_res_blocks": Bound("int", 1, 64),
    "attn_scales": Bound("floats", 0, 1e6, length=16), "temperal_downsample": Bound("bools", length=16),
    "dropout": Bound("float", 0, 1), "latents_mean": Bound("floats", -1e6, 1e6, length=4096),
    "latents_std": Bound("floats", 0, 1e6, low_open=True, length=4096),
    "in_channels": WIDTH, "out_channels": WIDTH, "patch_size": Bound("int", 1, 64, nullable=True),
    "scale_factor_temporal": Bound("int", 1, 64), "scale_factor_spatial": Bound("int", 1, 1024),
}  # fmt: skip
SCHEDULER_BOUNDS = {
    # its arrays are num_train_timesteps long: a huge value is a memory bomb of its own
    "num_train_timesteps": Bound("int", 1, 100_000), "solver_order": Bound("int", 1, 3),
    "flow_shift": POSITIVE, "beta_start": Bound("float", 0, 1), "beta_end": Bound("float", 0, 1),
    "steps_offset": Bound("int", 0, 100_000),
}  # fmt: skip
# A tokenizer.json larger than this is no tokenizer (Qwen's, the Nano's, is about 11 MB).
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024


def _default(key: str):
    """The transformer class's own default for a key its config leaves out (what from_config uses)."""
    return class_default("transformer", key)


def class_default(part: str, key: str):
    """The default of `key` in the constructor of a folder part's class (`transformer`: Cosmos3's,
    `vae`: Wan's): what from_config uses for a key the config leaves out."""
    import inspect

    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

    cls = {"transformer": Cosmos3OmniTransformer, "vae": AutoencoderKLWan}[part]
    return inspect.signature(cls.__init__).parameters[key].default


def with_class_defaults(part: str, config: dict, keys: tuple[str, ...]) -> dict:
    """`config` with each of `keys` it leaves out set to the class default (diffusers is imported
    only when a key is missing)."""
    missing = [k for k in keys if k not in config]
    return {**config, **{k: class_default(part, k) for k in missing}} if missing else config


def _raise(problem: FolderProblem | None) -> None:
    if problem is not None:
        raise UserError(f"{SETTING}: {problem}")


def _config(sub: Path, bounds: dict) -> tuple[Path, dict]:
    path = sub / "config.json"
    try:
        config = read_config(path, "config.json")
    except FolderProblem as exc:
        _raise(exc)
    _raise(config_problem(config, bounds, path))
    return path, config


def _weights(sub: Path) -> dict[str, tuple[int, ...]]:
    try:
        return folder_weight_shapes(sub)[0]
    except FolderProblem as exc:
        raise UserError(f"{SETTING}: {exc}") from None


def check_transformer(sub: Path, build_config: dict | None = None) -> dict:
    """`<folder>/transformer/`: its config (returned) is sane and builds what its weights hold.

    `build_config(config)` gives the config actually built (the text-to-image one, without the
    sound and action heads), so head weights on disk are extra, never missing."""
    from diffusers import Cosmos3OmniTransformer

    path, config = _config(sub, TRANSFORMER_BOUNDS)
    _check_built(sub, path, Cosmos3OmniTransformer, build_config(config) if build_config else config)
    return config


def check_vae(sub: Path) -> dict:
    """`<folder>/vae/`: its config (returned) is sane and builds what its weights hold."""
    from diffusers import AutoencoderKLWan

    path, config = _config(sub, VAE_BOUNDS)
    _check_built(sub, path, AutoencoderKLWan, config)
    return config


def _check_built(sub: Path, path: Path, cls, config: dict) -> None:
    """`cls` built from `config` on the meta device holds exactly the shapes `sub`'s weights declare."""
    try:
        shapes = meta_shapes(lambda: cls.from_config(config), path, cls.__name__)
        _raise(shape_problem(shapes, _weights(sub), path, sub))
    except FolderProblem as exc:
        _raise(exc)


def check_tokenizer_files(sub: Path) -> None:
    """The tokenizer folder holds a tokenizer.json of a sane size (the fast tokenizer reads only it)."""
    path = sub / "tokenizer.json"
    if not path.is_file():
        present = sorted(p.name for p in sub.iterdir())[:8]
        raise UserError(
            f"{SETTING}: {shown(sub)} has no tokenizer.json (found {present or 'nothing'}); "
            "save the tokenizer with save_pretrained, which writes it"
        )
    size = path.stat().st_size
    if size > MAX_TOKENIZER_BYTES:
        raise UserError(f"{SETTING}: {shown(path)} is {size} bytes, over the {MAX_TOKENIZER_BYTES}-byte cap for a tokenizer; use the model's own tokenizer")


def check_vocabulary(tokenizer_folder: Path, tokens: int, transformer_config: dict, transformer_folder: Path) -> None:
    """Every token id the tokenizer makes must index the transformer's embedding."""
    vocab = transformer_config.get("vocab_size", _default("vocab_size"))
    if tokens > vocab:
        raise UserError(
            f"{SETTING}: {shown(tokenizer_folder)} makes {tokens} token ids, but {shown(transformer_folder / 'config.json')} "
            f"vocab_size is {vocab}, so ids past it index no embedding; pair the tokenizer with its own transformer"
        )


def check_scheduler(path: Path, config: dict, transformer_config: dict) -> None:
    """The scheduler config's sizes and its timesteps' agreement with the transformer's timestep_scale."""
    _raise(config_problem(config, SCHEDULER_BOUNDS, path))
    steps = config.get("num_train_timesteps", 1000)
    scale = transformer_config.get("timestep_scale", _default("timestep_scale"))
    if not math.isclose(steps * scale, 1.0, rel_tol=1e-6):
        raise UserError(
            f"{SETTING}: the scheduler's num_train_timesteps ({steps}) is not 1 / the transformer's timestep_scale "
            f"({scale}), so the pipeline's timesteps would not be flow times; fix one of the two configs"
        )
