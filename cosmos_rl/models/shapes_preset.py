"""The `shapes` preset: a small Cosmos3 pretrained on the shapes world, shipped in the package.

`model.preset = "shapes"` (or `rl.init_from = "preset:shapes"`) loads it: `models.build` names
`build_shapes` by an import string, so `models/` never imports this module. It is the
architecture below with the weights in `cosmos_rl/models/presets/shapes/` (where every preset's
files live; float16 safetensors, widened to float32 on load), written by
`python -m cosmos_rl.commands.base_build build`, which also writes
`manifest.json` there: the files' sha256, the VAE's latent statistics, how the weights were made
(seed, steps, wall-clock, the command) and their held-out scores.

The architecture is a bit larger than `tiny` because smaller models only draw blobs here:

- transformer: hidden 128, 4 layers, 4 heads of 32 (2 KV heads), MLP 256, ~1.3 M parameters;
  rope_theta 100: the default 5e6 gives almost no position signal across a 4x4 patch grid;
- VAE: base width 16, 4 latent channels, patch 2 (32x32 RGB -> 4 x 8 x 8 latents), ~157 k
  parameters;
- the byte-level tiny tokenizer and the `minimal` prompt template (a caption is its bytes + 2
  ids, the unconditional prompt 2 ids), so rollouts and training see ~27 ids, not ~164.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer

from cosmos_rl.core.errors import UserError
from cosmos_rl.models.architectures import SHAPES_TRANSFORMER, SHAPES_VAE
from cosmos_rl.models.build import ModelParts, flow_scheduler
from cosmos_rl.models.tokenizer import build_tiny_tokenizer

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "models" / "presets" / "shapes"
MANIFEST = "manifest.json"
COMPONENT_FILES = {"transformer": "transformer.safetensors", "vae": "vae.safetensors"}
REBUILD = "python -m cosmos_rl.commands.base_build build"
STORED_DTYPE = torch.float16


def _transformer(vocab_size: int) -> Cosmos3OmniTransformer:
    return Cosmos3OmniTransformer(**copy.deepcopy(SHAPES_TRANSFORMER), vocab_size=vocab_size)


def _vae() -> AutoencoderKLWan:
    return AutoencoderKLWan(**copy.deepcopy(SHAPES_VAE))


def shapes_architecture(seed: int) -> ModelParts:
    """The preset's architecture with random weights drawn from `seed` (what the base is trained from)."""
    tokenizer = build_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = _vae()
        transformer = _transformer(len(tokenizer))
    transformer.eval()
    vae.eval()
    return ModelParts(transformer, vae, tokenizer, flow_scheduler(), prompt_template="minimal")


def set_latent_stats(vae: AutoencoderKLWan, mean: list[float], std: list[float]) -> None:
    """Record the per-channel latent statistics `models.vae` normalises with."""
    vae.register_to_config(latents_mean=[float(m) for m in mean], latents_std=[float(s) for s in std])


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_manifest(folder: Path = WEIGHTS_DIR, rebuild: str = REBUILD) -> dict:
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"model.preset: the shipped base is missing ({path} not found); rebuild it with `{rebuild}`") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"model.preset: {path} is unreadable ({exc}); rebuild it with `{rebuild}`") from None
    return manifest


def build_shapes(with_extra_heads: bool) -> ModelParts:
    """The `shapes` entry of `models.build.PRESETS`: the shipped base, which has no extra heads."""
    if with_extra_heads:
        raise ValueError("the shapes preset has no sound or action heads")
    return load_shapes_base()


def load_shapes_base(folder: Path = WEIGHTS_DIR, architecture=None, rebuild: str = REBUILD) -> ModelParts:
    """The shipped base: architecture + the float16 weights in `folder`, checked against its manifest.
    `architecture(seed)` builds the networks (default: the image base's); `rebuild` is the command
    an error names."""
    from safetensors.torch import load_file

    folder = Path(folder)
    manifest = read_manifest(folder, rebuild)
    parts = (architecture or shapes_architecture)(seed=0)
    for component, name in COMPONENT_FILES.items():
        path = folder / name
        expected = manifest.get("files", {}).get(name, {}).get("sha256")
        if not path.is_file() or sha256_of(path) != expected:
            found = "missing" if not path.is_file() else "its sha256 differs from manifest.json"
            raise UserError(f"model.preset: the shipped base file {path} is {found}; rebuild it with `{rebuild}`")
        state = {key: value.float() for key, value in load_file(path).items()}
        getattr(parts, component).load_state_dict(state, strict=True)
    set_latent_stats(parts.vae, manifest["latents_mean"], manifest["latents_std"])
    return parts


def write_weights(parts: ModelParts, folder: Path, info: dict) -> dict:
    """Write the transformer and VAE as float16 safetensors and `manifest.json` (`info` + files, stats)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for component, name in COMPONENT_FILES.items():
        state = getattr(parts, component).state_dict()
        save_file({k: v.detach().to(STORED_DTYPE).contiguous() for k, v in state.items()}, str(folder / name))
        files[name] = {"sha256": sha256_of(folder / name), "bytes": (folder / name).stat().st_size}
    config = parts.vae.config
    manifest = {
        **info,
        "stored_dtype": str(STORED_DTYPE).removeprefix("torch."),
        "files": files,
        "latents_mean": list(config.latents_mean),
        "latents_std": list(config.latents_std),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return manifest
