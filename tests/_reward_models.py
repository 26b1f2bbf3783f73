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


def eot_last_tokenizer(folder: Path) -> Path:
    """A letters-only CLIP tokenizer saved alone, its <|startoftext|>/<|endoftext|> the two largest
    ids as in the real CLIP vocabulary (49406, 49407), which open_clip's argmax pooling relies on."""
    from transformers import CLIPTokenizer

    vocab = {}
    for suffix in ("", "</w>"):
        for code in range(ord("a"), ord("z") + 1):
            vocab[chr(code) + suffix] = len(vocab)
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    folder.mkdir(parents=True, exist_ok=True)
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(folder)
    return folder


# A tiny CLIP in open_clip's layout: vision 2 layers x 16 (2 heads), patch 8 on 32 px; text 2 layers
# x 12 (3 heads), 16 positions; 8-wide embeddings. Head counts differ from ViT-H-14's 16 on purpose.
OPENCLIP_TINY = dict(vision_width=16, vision_layers=2, vision_heads=2, patch=8, side=SIDE,
                     text_width=12, text_layers=2, text_heads=3, context=16, vocab=54, embed=PROJECTION)  # fmt: skip


# open_clip's ViT-H-14 (its model config): vision 32 layers x 1280, head width 80, patch 14 on 224
# px; text 24 layers x 1024, 16 heads, 77 positions, 49408 tokens; 1024-wide embeddings.
OPENCLIP_VIT_H_14 = dict(vision_width=1280, vision_layers=32, vision_heads=16, patch=14, side=224,
                         text_width=1024, text_layers=24, text_heads=16, context=77, vocab=49408, embed=1024)  # fmt: skip


def openclip_state(seed: int = 0, dims: dict = OPENCLIP_TINY, meta: bool = False) -> dict[str, torch.Tensor]:
    """Random tensors under open_clip CLIP's state dict names and shapes (visual.conv1, fused
    attn.in_proj_weight, mlp.c_fc/c_proj, visual.proj [width, embed], ...); `meta`: shapes only
    (on the meta device, no memory), for full-size layouts, logit_scale alone holding its value."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.3):
        if meta:
            return torch.empty(*shape, device="meta")
        return torch.randn(*shape, generator=gen) * scale

    def norm(prefix, width):
        return {f"{prefix}.weight": 1 + rand(width, scale=0.1), f"{prefix}.bias": rand(width, scale=0.1)}

    def blocks(prefix, width, layers):
        out = {}
        for i in range(layers):
            p = f"{prefix}transformer.resblocks.{i}."
            out |= {p + "attn.in_proj_weight": rand(3 * width, width), p + "attn.in_proj_bias": rand(3 * width),
                    p + "attn.out_proj.weight": rand(width, width), p + "attn.out_proj.bias": rand(width),
                    p + "mlp.c_fc.weight": rand(4 * width, width), p + "mlp.c_fc.bias": rand(4 * width),
                    p + "mlp.c_proj.weight": rand(width, 4 * width), p + "mlp.c_proj.bias": rand(width)}  # fmt: skip
            out |= norm(p + "ln_1", width) | norm(p + "ln_2", width)
        return out

    v, t, grid = dims["vision_width"], dims["text_width"], dims["side"] // dims["patch"]
    state = {
        "visual.conv1.weight": rand(v, 3, dims["patch"], dims["patch"]), "visual.class_embedding": rand(v),
        "visual.positional_embedding": rand(grid * grid + 1, v), "visual.proj": rand(v, dims["embed"]),
        "token_embedding.weight": rand(dims["vocab"], t), "positional_embedding": rand(dims["context"], t),
        "text_projection": rand(t, dims["embed"]), "logit_scale": torch.tensor(4.6052),
    }  # fmt: skip
    state |= norm("visual.ln_pre", v) | norm("visual.ln_post", v) | norm("ln_final", t)
    return state | blocks("visual.", v, dims["vision_layers"]) | blocks("", t, dims["text_layers"])
