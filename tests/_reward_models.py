"""Tiny random CLIP checkpoints in the real folder layout (save_pretrained), for the model rewards."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

SIDE = 32  # the image processor resizes and crops every image to this
PROJECTION = 8


def tiny_clip_folder(folder: Path, seed: int = 0) -> Path:
    """A CLIPModel + CLIPProcessor (letters-only BPE vocabulary) saved as transformers does."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor, CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    for suffix in ("", "</w>"):
        for letter in letters:
            vocab[letter + suffix] = len(vocab)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[])
    images = CLIPImageProcessorPil(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE})
    text = dict(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=32, bos_token_id=0, eos_token_id=1, pad_token_id=1)  # fmt: skip
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=SIDE, patch_size=8)
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=PROJECTION))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(folder)
    return folder


def head_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A LAION-style head: Linear layers at layers.0, .2, .4 (dropouts between hold no weights)."""
    gen = torch.Generator().manual_seed(seed)
    widths = [PROJECTION, 6, 4, 1]
    state = {}
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        state[f"layers.{2 * i}.weight"] = torch.randn(b, a, generator=gen)
        state[f"layers.{2 * i}.bias"] = torch.randn(b, generator=gen)
    return state


def tiny_aesthetic_folder(folder: Path, seed: int = 0) -> Path:
    tiny_clip_folder(folder, seed)
    save_file(head_state(seed), str(folder / "aesthetic_head.safetensors"))
    return folder
