"""The one-time conversion of the released HPSv2.1 checkpoint (`HPS_v2.1_compressed.pt`, an
open_clip ViT-H-14 state dict, a torch pickle) into a transformers CLIP folder for the `hps` reward
(`cosmos-rl reward convert-hps`); what the folder scores and why open_clip is not used: `rewards.hps`.

The pickle is read as `convert-head` reads a head: its globals judged first, then
`torch.load(weights_only=True)`, so no code runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from cosmos_rl.core.errors import UserError, library_text
from cosmos_rl.rewards.hps import OPENAI_MEAN, OPENAI_STD, VIT_H_14_HEADS
from cosmos_rl.rewards.models import _state_problem, _umask, _unpickler_reason

# ViT-H-14 holds about a billion parameters (4 GB in float32); a CLIP state dict this large is something else.
MAX_SOURCE_BYTES = 16 << 30
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which open_clip's LayerNorm keeps

# open_clip block part -> transformers CLIPEncoderLayer part (each with .weight and .bias)
_BLOCK_PARTS = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2", "attn.out_proj": "self_attn.out_proj"}
_SHOWN = 5  # key names listed in a message


class _Keys:
    """The source state dict, each tensor taken at most once; what was asked for and absent is kept."""

    def __init__(self, state: dict):
        self.left = dict(state)
        self.missing: list[str] = []

    def take(self, key: str):
        if key not in self.left:
            self.missing.append(key)
            return None
        return self.left.pop(key)


def _layer_count(state: dict, prefix: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    return max(found) + 1 if found else 0


def _shape(state: dict, key: str, source: Path, dims: int) -> tuple[int, ...]:
    if key not in state:
        raise UserError(f"{str(source)!r}: no {key!r}; not an open_clip CLIP state dict (the HPSv2 release holds one under 'state_dict')")
    shape = tuple(state[key].shape)
    if len(shape) != dims:
        raise UserError(f"{str(source)!r}: {key!r} is shaped {shape}, expected {dims} dimensions as open_clip's CLIP has it")
    return shape


def infer_config(state: dict, source: Path, vision_heads: int, text_heads: int, quick_gelu: bool) -> dict:
    """A CLIPConfig dict from the open_clip state dict's shapes (and the head counts it cannot hold)."""
    v_width, _, patch, patch_w = _shape(state, "visual.conv1.weight", source, 4)
    positions = _shape(state, "visual.positional_embedding", source, 2)[0]
    grid = round((positions - 1) ** 0.5)
    if patch != patch_w or grid * grid != positions - 1:
        raise UserError(
            f"{str(source)!r}: visual.conv1.weight {tuple(state['visual.conv1.weight'].shape)} with {positions} vision positions "
            "is not a square grid of square patches plus a class token; not a ViT CLIP open_clip checkpoint"
        )
    vocab, t_width = _shape(state, "token_embedding.weight", source, 2)
    context = _shape(state, "positional_embedding", source, 2)[0]
    embed = _shape(state, "text_projection", source, 2)[1]
    v_layers, t_layers = _layer_count(state, "visual.transformer.resblocks."), _layer_count(state, "transformer.resblocks.")
    if not v_layers or not t_layers:
        raise UserError(f"{str(source)!r}: no {'visual.' if not v_layers else ''}transformer.resblocks.0.* tensors; not an open_clip CLIP state dict")
    v_mlp = _shape(state, "visual.transformer.resblocks.0.mlp.c_fc.weight", source, 2)[0]
    t_mlp = _shape(state, "transformer.resblocks.0.mlp.c_fc.weight", source, 2)[0]
    for what, width, heads, option in (("vision", v_width, vision_heads, "--vision-heads"), ("text", t_width, text_heads, "--text-heads")):
        if heads < 1 or width % heads:
            raise UserError(f"{option} {heads}: the {what} width {width} does not split into {heads} heads; give a divisor of {width} (ViT-H-14: 16)")
    act = "quick_gelu" if quick_gelu else "gelu"
    return {
        "projection_dim": embed,
        # a state dict without logit_scale is refused by openclip_to_transformers, naming it; this value is never written then
        "logit_scale_init_value": float(state["logit_scale"].float().reshape(-1)[0]) if "logit_scale" in state else 0.0,
        "text_config": {
            "vocab_size": vocab, "hidden_size": t_width, "intermediate_size": t_mlp, "num_hidden_layers": t_layers,
            "num_attention_heads": text_heads, "max_position_embeddings": context, "hidden_act": act,
            "layer_norm_eps": LAYER_NORM_EPS, "projection_dim": embed,
        },
        "vision_config": {
            "hidden_size": v_width, "intermediate_size": v_mlp, "num_hidden_layers": v_layers, "num_attention_heads": vision_heads,
            "image_size": grid * patch, "patch_size": patch, "num_channels": 3, "hidden_act": act,
            "layer_norm_eps": LAYER_NORM_EPS, "projection_dim": embed,
        },
    }  # fmt: skip


def _tower(keys: _Keys, src: str, dst: str, layers: int, out: dict, origin: dict) -> None:
    def put(name, tensor, from_key):
        if tensor is not None:
            out[name], origin[name] = tensor, from_key

    for i in range(layers):
        s, d = f"{src}transformer.resblocks.{i}.", f"{dst}encoder.layers.{i}."
        for part in ("weight", "bias"):
            fused = keys.take(s + f"attn.in_proj_{part}")
            if fused is not None:
                if fused.shape[0] % 3:
                    raise ValueError(f"{s}attn.in_proj_{part} is shaped {tuple(fused.shape)}: not q, k and v stacked (rows a multiple of 3)")
                for name, piece in zip(("q_proj", "k_proj", "v_proj"), fused.chunk(3, dim=0)):
                    put(f"{d}self_attn.{name}.{part}", piece, s + f"attn.in_proj_{part}")
            for a, b in _BLOCK_PARTS.items():
                put(f"{d}{b}.{part}", keys.take(f"{s}{a}.{part}"), f"{s}{a}.{part}")


def openclip_to_transformers(state: dict, config: dict) -> tuple[dict, dict]:
    """{transformers CLIPModel key: tensor} from an open_clip CLIP state dict, and {new key: source key}.

    Every source tensor is used exactly once: a ValueError names the tensors missing and those left
    over. Shapes are judged afterwards against the model the config builds.
    """
    keys, out, origin = _Keys(state), {}, {}

    def move(src, dst, transpose=False):
        tensor = keys.take(src)
        if tensor is not None:
            out[dst], origin[dst] = (tensor.T if transpose else tensor), src

    move("visual.conv1.weight", "vision_model.embeddings.patch_embedding.weight")
    move("visual.class_embedding", "vision_model.embeddings.class_embedding")
    move("visual.positional_embedding", "vision_model.embeddings.position_embedding.weight")
    for part in ("weight", "bias"):
        move(f"visual.ln_pre.{part}", f"vision_model.pre_layrnorm.{part}")  # transformers' own spelling
        move(f"visual.ln_post.{part}", f"vision_model.post_layernorm.{part}")
        move(f"ln_final.{part}", f"text_model.final_layer_norm.{part}")
    move("visual.proj", "visual_projection.weight", transpose=True)  # open_clip: x @ proj; Linear: x @ W.T
    move("token_embedding.weight", "text_model.embeddings.token_embedding.weight")
    move("positional_embedding", "text_model.embeddings.position_embedding.weight")
    move("text_projection", "text_projection.weight", transpose=True)
    scale = keys.take("logit_scale")
    if scale is not None:
        out["logit_scale"], origin["logit_scale"] = scale.reshape(()), "logit_scale"
    _tower(keys, "visual.", "vision_model.", config["vision_config"]["num_hidden_layers"], out, origin)
    _tower(keys, "", "text_model.", config["text_config"]["num_hidden_layers"], out, origin)
    problems = []
    if keys.missing:
        problems.append(f"missing {len(keys.missing)} tensor(s) {keys.missing[:_SHOWN]}")
    if keys.left:
        problems.append(f"{len(keys.left)} tensor(s) no CLIP part takes {sorted(keys.left)[:_SHOWN]}")
    if problems:
        raise ValueError("; ".join(problems))
    return out, origin


def _read_pickle_part(source: Path) -> bytes:
    """The pickle of a torch file without reading its tensor data: `data.pkl` of the zip format."""
    import zipfile

    from cosmos_rl.checkpoint.pickle_globals import pickle_bytes

    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(names) != 1:
                raise ValueError(f"a torch zip file holds one data.pkl, this one {len(names)}")
            return archive.read(names[0])
    return pickle_bytes(source.read_bytes())  # the legacy format: the pickle is the whole file


def _usable(path: Path, what: str, fix: str) -> Path:
    """`path` once the system can be asked about it: a UTF-8 name (the tokenizer library writes
    through Rust, which takes nothing else) whose lookup raises nothing but "not found"."""
    try:
        str(path).encode("utf-8")
        path.exists()
    except (OSError, ValueError) as exc:  # a name too long, an embedded NUL, undecodable bytes
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else library_text(exc)
        raise UserError(f"{what} {str(path)!r}: not a usable path ({reason}); {fix}") from None
    return path


def load_openclip_state(source: str | Path) -> dict:
    """The open_clip state dict of a .pt/.pth, read weights-only after its pickle's globals are judged."""
    import zipfile

    import torch

    from cosmos_rl.checkpoint.pickle_globals import refused_global

    source = _usable(Path(source), "SOURCE", "pass the released HPS_v2.1_compressed.pt")
    if not source.exists():
        raise UserError(f"{str(source)!r}: file not found; pass the released HPS_v2.1_compressed.pt")
    if not source.is_file():
        raise UserError(f"{str(source)!r}: not a regular file (a folder, device or pipe); pass the released HPS_v2.1_compressed.pt")
    size = source.stat().st_size
    if size > MAX_SOURCE_BYTES:
        raise UserError(f"{str(source)!r}: {size} bytes, over the {MAX_SOURCE_BYTES}-byte cap for a CLIP checkpoint (ViT-H-14 is about 4 GB in float32)")
    try:
        refused = refused_global(_read_pickle_part(source))
    except Exception as exc:  # not a pickle pickletools can walk: torch's loader would refuse it too
        raise UserError(f"{str(source)!r}: not a torch weights file ({library_text(exc, limit=200)})") from None
    if refused:
        raise UserError(f"{str(source)!r}: not a weights-only checkpoint (Unsupported global: {refused}); it would need code to load, which is refused")
    try:
        # mmap (the zip format only): the tensors stay on disk until the conversion reads each once
        state = torch.load(source, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(source))
    except Exception as exc:  # torch raises UnpicklingError and friends for anything but plain tensors
        raise UserError(f"{str(source)!r}: not a weights-only checkpoint ({_unpickler_reason(exc)}); it would need code to load, which is refused") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # how HPSv2 releases it (training checkpoints keep epoch/optimizer beside it)
    problem = _state_problem(state)
    if problem:
        raise UserError(f"{str(source)!r}: {problem}; pass the open_clip CLIP state dict (or a checkpoint holding it under 'state_dict')")
    if all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}  # saved from DistributedDataParallel, as open_clip's loader accepts
    return state


def _tokenizer(folder: Path):
    from transformers import CLIPTokenizer

    _usable(folder, "--tokenizer-from", "pass a local transformers CLIP ViT-H-14 folder")
    if not folder.is_dir():
        what = "not a folder" if folder.exists() else "folder not found"
        raise UserError(f"--tokenizer-from {folder}: {what}; pass a local transformers CLIP ViT-H-14 folder (its tokenizer is copied)")
    try:
        tokenizer = CLIPTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # the library's refusal, in one line
        raise UserError(f"--tokenizer-from {folder}: no loadable CLIP tokenizer ({library_text(exc)}); pass a transformers CLIP folder") from None
    return tokenizer


def _check_tokenizer(tokenizer, folder: Path, vocab: int) -> None:
    ids = tokenizer.get_vocab().values()
    top = max(ids)
    if top >= vocab:
        raise UserError(f"--tokenizer-from {folder}: the tokenizer makes ids up to {top} but the checkpoint embeds {vocab} tokens; use the tokenizer of the checkpoint's CLIP (ViT-H-14: 49408)")
    if tokenizer.eos_token_id != top:
        # open_clip pools the text at argmax(token ids), which is the end-of-text token only when it has the largest id
        raise UserError(
            f"--tokenizer-from {folder}: end-of-text token id {tokenizer.eos_token_id} is not the largest id ({top}); "
            "open_clip pools text at the largest id, so use a CLIP tokenizer whose <|endoftext|> comes last"
        )


def convert_hps(source: str | Path, out: str | Path, tokenizer_from: str | Path, vision_heads: int = VIT_H_14_HEADS["vision"],
                text_heads: int = VIT_H_14_HEADS["text"], quick_gelu: bool = False) -> dict:  # fmt: skip
    """One-time: the released HPSv2.1 .pt -> a transformers CLIP folder at `out` (a new or empty folder).

    Writes `config.json`, `model.safetensors` (float32), the tokenizer of `tokenizer_from` and a CLIP
    image processor at the model's side with OpenAI mean/std (what HPSv2 normalises with; the `hps`
    reward resizes and pads with `hps_pixels`). Written in a staging folder beside `out`, renamed
    when complete. Returns the config written.
    """
    import os
    import shutil
    import tempfile

    import torch
    from safetensors.torch import save_file
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor

    from cosmos_rl.checkpoint.weight_files import FolderProblem, meta_shapes

    source, out, tokenizer_from = Path(source), Path(out), Path(tokenizer_from)
    _usable(out, "--out", "give a new folder to write the converted model to")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {str(out)!r}: exists and is not an empty folder; give a new folder to write the converted model to")
    tokenizer = _tokenizer(tokenizer_from)
    state = load_openclip_state(source)
    config = infer_config(state, source, vision_heads, text_heads, quick_gelu)
    _check_tokenizer(tokenizer, tokenizer_from, config["text_config"]["vocab_size"])
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config["text_config"].update({k: v for k, v in ids.items() if v is not None})
    try:
        tensors, origin = openclip_to_transformers(state, config)
    except ValueError as exc:
        raise UserError(f"{str(source)!r}: not the open_clip CLIP layout: {exc}") from None
    clip_config = CLIPConfig.from_dict(config)
    try:
        expected = meta_shapes(lambda: CLIPModel(clip_config), source, "CLIPModel")
    except FolderProblem as exc:
        raise UserError(f"the CLIP inferred from {exc}") from None
    for key in sorted(set(expected) | set(tensors)):
        got = tuple(tensors[key].shape) if key in tensors else None
        if got != expected.get(key):
            raise UserError(
                f"{str(source)!r}: {origin.get(key, key)!r} is shaped {got} where the CLIP its other tensors describe needs "
                f"{expected.get(key)} (as {key}); the checkpoint is inconsistent, or --vision-heads/--text-heads do not fit it"
            )
    plain = {k: v.detach().to(dtype=torch.float32).contiguous().clone() for k, v in tensors.items()}
    side = config["vision_config"]["image_size"]
    images = CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side},
                                   image_mean=list(OPENAI_MEAN), image_std=list(OPENAI_STD))  # fmt: skip
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            clip_config.save_pretrained(staging)
            save_file(plain, str(staging / "model.safetensors"), metadata={"format": "pt"})
            CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(staging)
            os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's 0700, widened to what the user's umask gives
            os.replace(staging, out)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    except (OSError, UnicodeError) as exc:
        raise UserError(f"--out {str(out)!r}: cannot be written ({getattr(exc, 'strerror', None) or library_text(exc)}); give a writable folder") from None
    return config

