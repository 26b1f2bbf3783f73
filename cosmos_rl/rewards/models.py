"""Model rewards read from a local folder: PickScore, CLIPScore, a CLIP aesthetic predictor and HPSv2.1.

A folder holds a CLIP checkpoint in the standard transformers layout (`config.json`,
`model.safetensors`, the processor's tokenizer and image-processor files), as `save_pretrained`
writes it; the aesthetic predictor adds its head as `aesthetic_head.safetensors`. Nothing is
fetched from a hub (`local_files_only`) and weights load from safetensors only; a head published
as a pickled `.pth` is converted once with `convert_head` (`cosmos-rl reward convert-head`), and
the HPSv2.1 release (an open_clip checkpoint) into a whole folder with `rewards.hps_convert.convert_hps`
(`cosmos-rl reward convert-hps`).

Scores, for image i with prompt i (unit-normalised CLIP embeddings img_i, txt_i):
    pickscore  logit_scale.exp() * img_i . txt_i   (= CLIPModel's logits_per_image[i, i])
    clipscore  2.5 * max(img_i . txt_i, 0)         (the CLIPScore paper's w = 2.5)
    aesthetic  head(img_i)                          (prompt unused)
    hps        img_i . txt_i                        (HPSv2's score; images resized and padded as
                                                     HPSv2 does: `rewards.hps.hps_pixels`)
Each reward's revision is `KIND:sha256-<16 hex>` over the folder's weight and config files, so a
changed model cannot pass as the same revision.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cosmos_rl.checkpoint.weight_files import FolderProblem, read_safetensors_header
from cosmos_rl.core.errors import UserError, library_text
from cosmos_rl.rewards.clip_folder import check_clip_folder

MODEL_KINDS = ("pickscore", "clipscore", "aesthetic", "hps")
# Every model reward a folder serves: the CLIP ones here, and VideoAlign (rewards/videoalign.py).
SERVED_KINDS = (*MODEL_KINDS, "videoalign")
HEAD_FILE = "aesthetic_head.safetensors"
CLIPSCORE_W = 2.5
# Files whose bytes decide the scores: weights, model config, tokenizer and image processor.
_HASHED = re.compile(r".*\.(safetensors|json|txt|model)$")


def weights_digest(folder: Path) -> str:
    """sha256 over (relative name, bytes) of every file that decides the scores, in name order."""
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file() and _HASHED.fullmatch(p.name))
    for path in files:
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def revision_of(kind: str, folder: Path) -> str:
    return f"{kind}:sha256-{weights_digest(folder)[:16]}"


def _check_folder(kind: str, folder: Path, option: str = "--model") -> None:
    if not folder.is_dir():
        raise UserError(f"{option} {kind}={folder}: folder not found; pass a local folder with a transformers CLIP checkpoint")
    if not any(folder.glob("*.safetensors")):
        raise UserError(
            f"{option} {kind}={folder}: no .safetensors weights in the folder (pickled .bin/.pth weights are "
            "never loaded); re-save the model with save_pretrained(safe_serialization=True)"
        )
    if kind == "aesthetic" and not (folder / HEAD_FILE).is_file():
        raise UserError(
            f"{option} aesthetic={folder}: no {HEAD_FILE}; convert a published .pth head once with "
            f"`cosmos-rl reward convert-head HEAD.pth {folder / HEAD_FILE}`"
        )


def _device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class ClipRewardModel:
    """One CLIP model and processor from a folder, scoring batches with one of the three rewards."""

    def __init__(self, kind: str, folder: str | Path, device: str = "auto", option: str = "--model"):
        # `option`: what named the folder, so a message names it (`reward serve --model`, `eval --reward`).
        import torch
        from transformers import CLIPModel, CLIPProcessor
        from transformers.utils import logging as hf_logging

        if kind not in MODEL_KINDS:
            raise UserError(f"{option} {kind}=...: unknown model reward {kind!r}; use one of {list(MODEL_KINDS)}")
        folder = Path(folder).expanduser().resolve()
        _check_folder(kind, folder, option)
        # Config, weights' headers, processor and tokenizer judged before anything is allocated.
        check_clip_folder(kind, folder, option)
        self.kind, self.folder = kind, folder
        self.device = _device(device)
        hf_logging.set_verbosity_error()  # no progress bars or backend notes in the service log
        try:
            self.model = CLIPModel.from_pretrained(folder, use_safetensors=True, local_files_only=True)
            self.processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)
        except Exception as exc:  # the library's refusal of a file the checks above let through
            raise UserError(f"{option} {kind}={folder}: not a loadable CLIP checkpoint with its processor ({library_text(exc)})") from None
        self.model.to(self.device).eval()
        self.max_text = int(self.model.config.text_config.max_position_embeddings)
        self.head = load_head(folder / HEAD_FILE, self.device) if kind == "aesthetic" else None
        if self.head is not None and self.head[0][0].shape[1] != self.model.config.projection_dim:
            raise UserError(
                f"{option} aesthetic={folder}: {HEAD_FILE} takes {self.head[0][0].shape[1]}-wide embeddings but the "
                f"CLIP model makes {self.model.config.projection_dim}-wide ones; pair the head with its CLIP model"
            )
        self.revision = revision_of(kind, folder)
        self._torch = torch

    def image_embeddings(self, images: np.ndarray):
        if self.kind == "hps":
            from cosmos_rl.rewards.hps import hps_pixels

            side, spec = self.model.config.vision_config.image_size, self.processor.image_processor
            pixels = hps_pixels(images, side, spec.image_mean, spec.image_std).to(self.device)
        else:
            pixels = self.processor(images=list(images), return_tensors="pt")["pixel_values"].to(self.device)
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        embeds = self.model.visual_projection(pooled)
        return embeds / embeds.norm(dim=-1, keepdim=True)

    def text_embeddings(self, prompts: Sequence[str]):
        tokens = self.processor(
            text=list(prompts), return_tensors="pt", padding=True, truncation=True, max_length=self.max_text
        )  # fmt: skip
        pooled = self.model.text_model(
            input_ids=tokens["input_ids"].to(self.device), attention_mask=tokens["attention_mask"].to(self.device)
        ).pooler_output
        embeds = self.model.text_projection(pooled)
        return embeds / embeds.norm(dim=-1, keepdim=True)

    def __call__(self, images: np.ndarray, prompts: Sequence[str]) -> list[float]:
        from cosmos_rl.rewards.functions import check_images

        check_images(images, prompts)
        with self._torch.no_grad():
            img = self.image_embeddings(images)
            if self.kind == "aesthetic":
                scores = apply_head(self.head, img)
            else:
                cos = (img * self.text_embeddings(prompts)).sum(dim=-1)
                if self.kind == "pickscore":
                    scores = self.model.logit_scale.exp() * cos
                elif self.kind == "hps":
                    scores = cos
                else:
                    scores = CLIPSCORE_W * cos.clamp(min=0)
        return [float(s) for s in scores.double().cpu()]


# ------------------------------------------------------------------------------ aesthetic head
_LAYER_KEY = re.compile(r"(?:(.*)\.)?(\d+)\.(weight|bias)")


def head_layers(state: dict) -> list[tuple]:
    """The head's Linear layers in order: a single `weight`/`bias` pair, or `<prefix>.<index>.weight`/
    `.bias` pairs (the LAION predictors' `layers.0 ... layers.7`, whose dropouts hold no weights).

    The LAION heads have no activation between their Linear layers, so none is applied here.
    """
    indexed: dict[int, dict[str, object]] = {}
    if set(state) == {"weight", "bias"}:
        indexed[0] = dict(state)
    else:
        for key, tensor in state.items():
            match = _LAYER_KEY.fullmatch(key)
            if not match:
                raise ValueError(f"unexpected tensor {key!r}; an aesthetic head holds Linear layers only")
            indexed.setdefault(int(match.group(2)), {})[match.group(3)] = tensor
    layers = []
    for index in sorted(indexed):
        parts = indexed[index]
        if set(parts) != {"weight", "bias"}:
            raise ValueError(f"layer {index} has {sorted(parts)}, expected weight and bias")
        if parts["weight"].dim() != 2 or parts["bias"].shape != (parts["weight"].shape[0],):
            raise ValueError(f"layer {index} is not a Linear layer: weight {tuple(parts['weight'].shape)}, bias {tuple(parts['bias'].shape)}")
        layers.append((parts["weight"], parts["bias"]))
    if not layers:
        raise ValueError("no layers in the head")
    for (w1, _), (w2, _) in zip(layers, layers[1:]):
        if w1.shape[0] != w2.shape[1]:
            raise ValueError(f"layer widths do not chain: {tuple(w1.shape)} then {tuple(w2.shape)}")
    if layers[-1][0].shape[0] != 1:
        raise ValueError(f"the last layer must output one score, got {layers[-1][0].shape[0]}")
    return layers


def load_head(path: Path, device) -> list[tuple]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        read_safetensors_header(path)  # bounded, and every tensor inside the file, before any is read
        state = load_file(str(path), device=str(device))
        return [(w.float(), b.float()) for w, b in head_layers(state)]
    except (FolderProblem, ValueError, OSError, RuntimeError, SafetensorError) as exc:
        raise UserError(
            f"{path}: not an aesthetic head ({library_text(exc)}); convert the published head with `cosmos-rl reward convert-head`"
        ) from None


def apply_head(layers: list[tuple], embeds):
    x = embeds.float()
    for weight, bias in layers:
        x = x @ weight.T + bias
    return x[:, 0]


# A published aesthetic head is a few MB; a .pth this large is something else.
MAX_HEAD_BYTES = 1 << 30


def _check_source(source: Path) -> None:
    if not source.exists():
        raise UserError(f"{str(source)!r}: file not found; pass the head's .pth/.pt file")
    if not source.is_file():
        raise UserError(f"{str(source)!r}: not a regular file (a folder, device or pipe); pass the head's .pth/.pt file")
    size = source.stat().st_size
    if size > MAX_HEAD_BYTES:
        raise UserError(f"{str(source)!r}: {size} bytes, over the {MAX_HEAD_BYTES}-byte cap for a head (published heads are a few MB); pass the head's .pth/.pt file")


def _check_target(target: Path) -> None:
    if target.is_dir():
        raise UserError(f"{str(target)!r}: is a folder; give the file to write, e.g. {str(target / HEAD_FILE)!r}")
    if target.exists() and not target.is_file():
        raise UserError(f"{str(target)!r}: exists and is not a regular file; give a new .safetensors path")
    if target.suffix != ".safetensors":
        raise UserError(f"{str(target)!r}: does not end in .safetensors; name it e.g. {HEAD_FILE}")


def _unpickler_reason(exc: BaseException) -> str:
    """torch's reason in one line: the unpickler's own sentence (e.g. "Unsupported global: GLOBAL
    print was not an allowed global by default."), without the advice around it to load with
    weights_only=False or to allow the global, which would run the file's code."""
    text = library_text(exc, limit=100_000)
    found = re.search(r"WeightsUnpickler error: (.*?\.)(?: |$)", text)
    return (found.group(1) if found else text)[:200]


def _state_problem(state) -> str | None:
    """Why `state` is not a plain state dict of dense tensors with values, or None."""
    import torch

    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a state dict (tensor name -> tensor)"
    if not state:
        return "holds an empty state dict"
    for key, value in state.items():
        name = repr(key) if isinstance(key, str) else f"{key!r} (of type {type(key).__name__})"
        if not isinstance(key, str):
            return f"has key {name[:80]}; a state dict's keys are tensor names (strings)"
        if not isinstance(value, torch.Tensor):
            return f"has {name[:80]} holding a {type(value).__name__}, not a tensor"
        if value.layout != torch.strided:
            return f"has {name[:80]} as a {str(value.layout).removeprefix('torch.')} tensor; only dense tensors are heads"
        if value.device.type == "meta":
            return f"has {name[:80]} on the meta device (a shape without values)"
        if value.is_quantized or value.is_complex():
            return f"has {name[:80]} of dtype {str(value.dtype).removeprefix('torch.')}; a head holds real floats"
    return None


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def convert_head(source: str | Path, target: str | Path) -> list[str]:
    """One-time: a pickled .pth/.pt head -> safetensors, reading with `weights_only=True` (no code runs).

    Accepts a plain state dict, or one nested under `state_dict`. Tensors that share storage are
    written as separate copies. The file is written under a temporary name beside `target` and
    renamed when complete. Returns the tensor names written.
    """
    import os
    import tempfile

    import torch
    from safetensors.torch import save_file

    source, target = Path(source), Path(target)
    _check_source(source)
    _check_target(target)
    from cosmos_rl.checkpoint.pickle_globals import pickle_bytes, refused_global

    try:
        refused = refused_global(pickle_bytes(source.read_bytes()))
    except Exception as exc:  # not a pickle pickletools can walk: torch's loader would refuse it too
        raise UserError(f"{str(source)!r}: not a torch weights file ({library_text(exc, limit=200)})") from None
    if refused:
        raise UserError(
            f"{str(source)!r}: not a weights-only checkpoint (Unsupported global: {refused}); it would need code to load, which is refused"
        )
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError and friends for anything but plain tensors
        raise UserError(
            f"{str(source)!r}: not a weights-only checkpoint ({_unpickler_reason(exc)}); it would need code to load, which is refused"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    problem = _state_problem(state)
    if problem:
        raise UserError(f"{str(source)!r}: {problem}; pass the head's own state dict (layers.N.weight / .bias tensors)")
    try:
        head_layers(state)
    except ValueError as exc:
        raise UserError(f"{str(source)!r}: not an aesthetic head: {exc}") from None
    # clone: safetensors refuses tensors sharing storage, and a view must not drag its whole storage along
    plain = {k: v.detach().clone().contiguous() for k, v in state.items()}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(handle)
        try:
            save_file(plain, staging)
            os.chmod(staging, 0o666 & ~_umask())  # mkstemp's 0600, widened to what the user's umask gives
            os.replace(staging, target)
        finally:
            if os.path.exists(staging):
                os.unlink(staging)
    except OSError as exc:
        raise UserError(f"{str(target)!r}: cannot be written ({exc.strerror or library_text(exc)}); give a writable path") from None
    return sorted(state)
