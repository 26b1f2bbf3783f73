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


# ------------------------------------------------------------------------------ VideoAlign
VA_PIXELS = 28 * 28 * 4  # the tiny folder's frame budget (up to 56x56): a 32x32 frame becomes 28x28 (2x2 patches)
VA_SETTINGS = {"VQ_mean": 0.5, "VQ_std": 2.0, "MQ_mean": -1.0, "MQ_std": 0.5, "TA_mean": 0.25, "TA_std": 4.0}
# A stand-in for the release's detailed_special template (its own text is not ours to ship): the prompt
# slot and the three reward tokens in the release's order, which is all the code relies on.
VA_TEMPLATE = ("rate the clip. visual <|VQ_reward|> end. motion <|MQ_reward|> end. "
               "prompt - {text_prompt} text <|TA_reward|> end")


def tiny_videoalign_folder(folder: Path, seed: int = 0, head: bool = True, hidden: int = 32) -> Path:
    """A tiny random Qwen2VLForConditionalGeneration with a byte-level tokenizer (the three reward
    tokens and Qwen2-VL's chat tokens added), `rm_head.weight` [1, hidden] in its own safetensors
    file, the release's model_config.json (small frame budget, normalisation) and a prompt template."""
    import json

    from transformers import Qwen2Tokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}  # every byte, no merges
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>",
                "<|image_pad|>", "<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>"]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], pad_token="<|endoftext|>", unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096, rope_theta=10000.0, bos_token_id=None,
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, in_channels=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], pad_token_id=ids["<|endoftext|>"], bos_token_id=None, eos_token_id=ids["<|im_end|>"],
    )  # fmt: skip
    torch.manual_seed(seed)
    Qwen2VLForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if head:
        save_file({"rm_head.weight": torch.randn(1, hidden, generator=torch.Generator().manual_seed(seed + 1))}, str(folder / "rm_head.safetensors"))
    settings = {"data_config": {"fps": 2, "max_frame_pixels": VA_PIXELS, "min_frame_pixels": 28 * 28}, "inference_config": VA_SETTINGS}
    (folder / "model_config.json").write_text(json.dumps(settings))
    (folder / "prompt_template.txt").write_text(VA_TEMPLATE)
    return folder
