"""What a model folder or base checkpoint is, read from its files alone (no torch, no diffusers).

Preflight, `plan` and the loaders share these answers, so what `plan` says a base is, is what the
run loads. A *pipeline folder* is what diffusers' `save_pretrained` writes for a whole
Cosmos3 pipeline: `model_index.json` with `transformer/`, `vae/`, `text_tokenizer/` (or
`tokenizer/`) and `scheduler/` beside it; a base holding only weights is a *weights folder*
(`transformer/*.safetensors` or `*.safetensors` directly) or a *DCP checkpoint* (`.metadata`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.files import MAX_METADATA_BYTES, read_user_json

PIPELINE_INDEX = "model_index.json"
# What cosmos-rl adds to a model folder: {"prompt_template": ...} (models.build.save_parts), and in an
# exported one {"exported_from": {run, step, algorithm, run_identity, sampler}} (commands/export.py).
MODEL_INFO = "cosmos_rl.json"
SCHEDULER_CONFIG = Path("scheduler") / "scheduler_config.json"
S3_SCHEME = "s3://"
PRESET_SCHEME = "preset:"

# The flow shift of each built-in preset's scheduler (what an unset rl.sampler_shift means there).
PRESET_FLOW_SHIFT = {"tiny": 1.0, "shapes": 1.0, "shapes_video": 1.0, "pusht": 1.0}
# The presets whose pretrained weights ship in the package (cosmos_rl/models/presets/NAME); the rest are random.
SHIPPED_PRESETS = ("shapes", "shapes_video", "pusht")


def is_pipeline_folder(folder: str | Path) -> bool:
    return (Path(folder) / PIPELINE_INDEX).is_file()


def base_format(folder: str | Path) -> tuple[str, Path] | None:
    """("dcp" | "safetensors", the folder holding the files) for a base checkpoint, else None."""
    folder = Path(folder)
    if (folder / ".metadata").is_file():
        return "dcp", folder
    for candidate in (folder / "transformer", folder):
        if candidate.is_dir() and any(candidate.glob("*.safetensors")):
            return "safetensors", candidate
    return None


def read_json(path: Path, shown_as: str) -> dict:
    """A JSON object from `path`; ValueError naming `shown_as` when it is not one."""
    try:
        # core.files: a FIFO or device is refused (not read forever), and a file past the cap.
        data = read_user_json(path, "", shown_as, MAX_METADATA_BYTES)
    except UserError as exc:
        raise ValueError(f"{shown_as} cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{shown_as} holds {type(data).__name__}, not a JSON object")
    return data


def scheduler_problem(config: dict) -> str | None:
    """Why a scheduler config is not the flow-prediction UniPC the sampler runs, or None."""
    name = config.get("_class_name", "UniPCMultistepScheduler")
    if name != "UniPCMultistepScheduler":
        return f"is a {name}, not a UniPCMultistepScheduler"
    if not config.get("use_flow_sigmas", False) or config.get("prediction_type") != "flow_prediction":
        return "is not in flow mode (needs use_flow_sigmas = true and prediction_type = \"flow_prediction\")"
    return None


def folder_flow_shift(folder: str | Path) -> float:
    """The flow shift in `<folder>/scheduler/scheduler_config.json` (diffusers' default 1.0 if absent)."""
    config = read_json(Path(folder) / SCHEDULER_CONFIG, str(Path(folder) / SCHEDULER_CONFIG))
    return float(config.get("flow_shift", 1.0))


def init_cache_root(output_dir: str | Path) -> Path:
    """Where `s3://` bases are pulled to: one cache per `job.output_dir`, shared by its runs."""
    return Path(output_dir) / ".cache" / "init_from"


def split_s3(url: str) -> tuple[str, str]:
    """("bucket", "prefix/") of an s3:// URL ("" prefix for the whole bucket); ValueError without a bucket."""
    bucket, _, prefix = url[len(S3_SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} has no bucket; write s3://bucket/prefix")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def s3_cache_dir(url: str, cache_root: str | Path) -> Path:
    """The folder `url` is pulled into: named by a hash of the normalised URL, so a trailing slash
    or a second spelling of the same prefix reuses one copy."""
    bucket, prefix = split_s3(url)
    return Path(cache_root) / hashlib.sha256(f"s3://{bucket}/{prefix}".encode()).hexdigest()[:32]
