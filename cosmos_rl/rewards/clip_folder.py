"""A CLIP reward folder (`reward serve --model KIND=FOLDER`) judged before the model is built.

The same checks as a Cosmos3 pipeline folder's (`checkpoint.weight_files`): `config.json` is
bounded JSON whose sizes are within bounds, the model it makes is built on the meta device (no
memory) and must hold exactly the tensors the weights' safetensors headers declare, and an index
may only name files inside the folder. On top, the image processor's config may not ask for more
than the model takes: CLIP's position embeddings fix its input side (`vision_config.image_size`),
so the crop must be that side and the resize at most `MAX_RESIZE` times it; a huge `crop_size`
would otherwise pad every 32x32 request to its size.

Every problem is a `UserError` starting `--model KIND=FOLDER:`, naming the file and key.
"""

from __future__ import annotations

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

WIDTH = Bound("int", 1, 1 << 16)
POSITIVE = Bound("float", 0, 1e6, low_open=True)
TEXT_BOUNDS = {
    "vocab_size": Bound("int", 1, 1 << 22), "hidden_size": WIDTH, "intermediate_size": WIDTH, "projection_dim": WIDTH,
    "num_hidden_layers": Bound("int", 1, 256), "num_attention_heads": Bound("int", 1, 1024),
    "max_position_embeddings": Bound("int", 1, 1 << 16), "layer_norm_eps": POSITIVE,
}  # fmt: skip
VISION_BOUNDS = {
    "hidden_size": WIDTH, "intermediate_size": WIDTH, "projection_dim": WIDTH,
    "num_hidden_layers": Bound("int", 1, 256), "num_attention_heads": Bound("int", 1, 1024),
    "num_channels": Bound("int", 1, 16), "image_size": Bound("int", 1, 4096), "patch_size": Bound("int", 1, 4096),
    "layer_norm_eps": POSITIVE,
}  # fmt: skip
TOP_BOUNDS = {"projection_dim": WIDTH, "logit_scale_init_value": Bound("float", -1e6, 1e6)}
# The processor may resize an image's side to at most this many times the model's input side
# before cropping (CLIP's processors resize to the side itself: 224 for 224).
MAX_RESIZE = 4
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024  # CLIP's tokenizer.json is about 3.6 MB


def check_clip_folder(kind: str, folder: Path, option: str = "--model") -> None:
    """Raise UserError for the first thing that keeps `folder` from being a CLIP model + processor
    that builds within bounds; returns only when building it allocates no more than its files hold."""
    try:
        config = _checked_config(folder)
        _check_weights(folder, config)
        _check_processor(folder, config.get("vision_config") or {})
        _check_tokenizer(folder)
    except FolderProblem as exc:
        raise UserError(f"{option} {kind}={folder}: {exc}") from None


def _checked_config(folder: Path) -> dict:
    path = folder / "config.json"
    config = read_config(path, "config.json")
    problem = config_problem(config, TOP_BOUNDS, path)
    for section, bounds in (("text_config", TEXT_BOUNDS), ("vision_config", VISION_BOUNDS)):
        value = config.get(section, {})
        if value is not None and not isinstance(value, dict):
            raise FolderProblem(f"{shown(path)}: {section} is not a JSON object; restore the config save_pretrained wrote")
        problem = problem or config_problem(value or {}, bounds, path, prefix=f"{section}.")
    if problem:
        raise problem
    return config


def _check_weights(folder: Path, config: dict) -> None:
    from transformers import CLIPConfig, CLIPModel

    path = folder / "config.json"
    shapes = meta_shapes(lambda: CLIPModel(CLIPConfig.from_dict(config)), path, "CLIPModel")
    problem = shape_problem(shapes, folder_weight_shapes(folder)[0], path, folder)
    if problem:
        raise problem


def _sides(value, path: Path, key: str) -> list[int]:
    """The integers a processor's `size` / `crop_size` holds (an int, or a dict of named sides)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, dict) and value and set(value) <= {"height", "width", "shortest_edge", "longest_edge"}:
        sides = list(value.values())
        if all(isinstance(v, int) and not isinstance(v, bool) for v in sides):
            return sides
    raise FolderProblem(
        f"{shown(path)}: image processor {key} is {str(value)[:60]}; it must be an integer or "
        "{height, width} / {shortest_edge} integers"
    )


def _image_processor_configs(folder: Path) -> list[tuple[Path, dict]]:
    """Every image processor config the folder holds: `processor_config.json`'s `image_processor`
    (what transformers 5 writes) and a whole `preprocessor_config.json` (older saves); both are
    judged when both are there, whichever the library ends up reading."""
    found = []
    for name in PROCESSOR_FILES:
        path = folder / name
        if not path.is_file():
            continue
        data = read_config(path, name)
        if name == "processor_config.json":
            if "image_processor" not in data:
                continue  # an older processor_config.json names the classes only
            data = data["image_processor"]
        if not isinstance(data, dict):
            raise FolderProblem(f"{shown(path)}: image_processor is not a JSON object; save the CLIPProcessor with save_pretrained")
        found.append((path, data))
    if not found:
        raise FolderProblem(f"{shown(folder)}: no image processor config ({' or '.join(PROCESSOR_FILES)}); save the CLIPProcessor with save_pretrained")
    return found


def _check_processor(folder: Path, vision: dict) -> None:
    for path, processor in _image_processor_configs(folder):
        _check_image_processor(path, processor, vision)


def _check_image_processor(path: Path, processor: dict, vision: dict) -> None:
    side = vision.get("image_size", 224)
    crop = processor.get("do_center_crop", True)
    fix = f"the model takes {side}x{side} images (vision_config.image_size); use the processor saved with it"
    if crop:
        crops = _sides(processor.get("crop_size", side), path, "crop_size")
        if any(c != side for c in crops):
            raise FolderProblem(f"{shown(path)}: image processor crop_size is {processor.get('crop_size')}; {fix}")
    if processor.get("do_resize", True):
        sizes = _sides(processor.get("size", side), path, "size")
        if any(not 1 <= s <= MAX_RESIZE * side for s in sizes):
            raise FolderProblem(
                f"{shown(path)}: image processor size is {processor.get('size')}, outside 1 to {MAX_RESIZE * side} "
                f"({MAX_RESIZE}x the model's input side); {fix}"
            )
    if not crop and not (processor.get("do_resize", True) and processor.get("size") == {"height": side, "width": side}):
        raise FolderProblem(
            f"{shown(path)}: image processor neither crops nor resizes to {{height: {side}, width: {side}}} "
            f"(size {processor.get('size')}); {fix}"
        )
    channels = vision.get("num_channels", 3)
    for key, bound in (("image_mean", Bound("floats", -1e6, 1e6)), ("image_std", Bound("floats", 0, 1e6, low_open=True))):
        value = processor.get(key)
        if value is not None and (not bound.accepts(value) or len(value) != channels):
            raise FolderProblem(
                f"{shown(path)}: image processor {key} is {str(value)[:60]}; it must be {channels} numbers, "
                f"{bound.describe().split(', each ')[-1]}"
            )
    problem = config_problem(processor, {"rescale_factor": Bound("float", 0, 1, low_open=True)}, path, prefix="image processor ")
    if problem:
        raise problem


def _check_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        path = folder / name
        if path.is_file() and path.stat().st_size > MAX_TOKENIZER_BYTES:
            raise FolderProblem(f"{shown(path)}: {path.stat().st_size} bytes, over the {MAX_TOKENIZER_BYTES}-byte cap for a tokenizer file")
    if not (folder / "tokenizer.json").is_file() and not (folder / "vocab.json").is_file():
        raise FolderProblem(f"{shown(folder)}: no tokenizer (tokenizer.json, or vocab.json and merges.txt); save the CLIPProcessor with save_pretrained")
