"""Prompt -> token ids, exactly as `Cosmos3OmniPipeline.tokenize_prompt` does it for an image or a clip.

The pipeline wraps each prompt in a chat (system turn + user turn + open assistant turn),
optionally appends a resolution sentence (its negation for the unconditional prompt; for a clip
a duration sentence first and the video system prompt), and ends the ids with EOS then
`<|vision_start|>`, after which the vision tokens follow.

That is the `chat` prompt template. A model may name another one (`ModelParts.prompt_template`,
saved with the model): `minimal` is the prompt's own bytes, then EOS and `<|vision_start|>` (no
turns, no system prompt, no resolution sentence). For a small model the chat template's system
prompt is most of the sequence (~164 tokens for a ~22-byte caption against ~27 with `minimal`),
and every trainer and sampler tokenizes through `model_prompt_ids`, so a model is always fed the
template it was trained with.
"""

from __future__ import annotations

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _SYSTEM_PROMPT_IMAGE, _SYSTEM_PROMPT_VIDEO
from transformers import PreTrainedTokenizerBase

from cosmos_rl.core.media import MediaSpec

VISION_START_TOKEN = "<|vision_start|>"
PROMPT_TEMPLATES = ("chat", "minimal")


def _with_sentence(text: str, sentence: str) -> str:
    # The pipeline joins with ". " after dropping the text's own trailing full stops.
    text = text.rstrip(".")
    return f"{text}. {sentence}" if text else sentence


def _resolution_sentence(resolution: tuple[int, int], negated: bool, noun: str = "image") -> str:
    height, width = resolution
    verb = "is not of" if negated else "is of"
    return f"This {noun} {verb} {height}x{width} resolution."


def _duration_sentence(media: MediaSpec, negated: bool) -> str:
    # The pipeline's duration template: seconds to one decimal, fps to a whole number.
    if negated:
        return f"The video is not {media.seconds:.1f} seconds long and is not of {media.fps:.0f} FPS."
    return f"The video is {media.seconds:.1f} seconds long and is of {media.fps:.0f} FPS."


def _encode(tokenizer: PreTrainedTokenizerBase, text: str, system_prompt: str | None) -> list[int]:
    """The chat ids of `text`, after a system turn of `system_prompt` (None: no system turn)."""
    turns = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    turns.append({"role": "user", "content": text})
    encoded = tokenizer.apply_chat_template(
        turns, tokenize=True, add_generation_prompt=True, add_vision_id=False, return_dict=True
    )
    vision_start = tokenizer.convert_tokens_to_ids(VISION_START_TOKEN)
    return list(encoded["input_ids"]) + [tokenizer.eos_token_id, vision_start]


def chat_ids(tokenizer: PreTrainedTokenizerBase, text: str, *, media: MediaSpec, use_system_prompt: bool = True) -> list[int]:
    """`text` as the pipeline's user turn, as it is (no sentence appended): the chat turns, the
    system prompt of `media` (image or video), then EOS and `<|vision_start|>` (its action captions go this way)."""
    system_prompt = (_SYSTEM_PROMPT_VIDEO if media.is_video else _SYSTEM_PROMPT_IMAGE) if use_system_prompt else None
    return _encode(tokenizer, text, system_prompt)


def _minimal(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    return list(ids) + [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(VISION_START_TOKEN)]


def model_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, template: str, prompts: list[str], media: MediaSpec
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(cond, uncond) ids of `prompts` under a model's prompt template, for images of `media`'s size.

    `chat`: the pipeline's template with its system prompt and resolution sentence (for video the
    video system prompt, the duration sentence, then "This video is of HxW resolution.");
    `minimal`: the prompt's bytes + EOS + `<|vision_start|>`, the unconditional prompt only the
    last two (so "a circle" is 8 + 2 ids and its uncond 2 ids with the byte tokenizer), for images
    and clips alike.
    """
    if template == "chat":
        if media.is_video:
            return tokenize_video_prompts(tokenizer, prompts, media)
        return tokenize_prompts(tokenizer, prompts, resolution=media.size)
    if template != "minimal":
        raise ValueError(f"unknown prompt template {template!r}; known: {PROMPT_TEMPLATES}")
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, got a single string")
    uncond = torch.tensor(_minimal(tokenizer, ""), dtype=torch.long)
    cond = [torch.tensor(_minimal(tokenizer, prompt), dtype=torch.long) for prompt in prompts]
    return cond, [uncond.clone() for _ in prompts]


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    resolution: tuple[int, int] | None = None,
    negative_prompt: str = "",
    use_system_prompt: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(cond, uncond) 1-D LongTensors per prompt, as the pipeline builds them for an image.

    `resolution=(height, width)` appends the pipeline's resolution sentence (the pipeline's
    default); `None` matches the pipeline called with `add_resolution_template=False`.
    """
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, got a single string")
    cond, uncond = [], []
    system_prompt = _SYSTEM_PROMPT_IMAGE if use_system_prompt else None
    for prompt in prompts:
        cond_text, uncond_text = prompt, negative_prompt
        if resolution is not None:
            cond_text = _with_sentence(cond_text, _resolution_sentence(resolution, negated=False))
            uncond_text = _with_sentence(uncond_text, _resolution_sentence(resolution, negated=True))
        cond.append(torch.tensor(_encode(tokenizer, cond_text, system_prompt), dtype=torch.long))
        uncond.append(torch.tensor(_encode(tokenizer, uncond_text, system_prompt), dtype=torch.long))
    return cond, uncond


def tokenize_video_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    media: MediaSpec,
    *,
    negative_prompt: str = "",
    use_system_prompt: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(cond, uncond) ids per prompt as the pipeline builds them for a clip of `media` (its
    defaults: the video system prompt, then the duration and resolution sentences appended to the
    prompt and their negations to the unconditional prompt)."""
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, got a single string")
    if not media.is_video:
        raise ValueError(f"{media} is one frame: tokenize it with tokenize_prompts")

    def with_sentences(text: str, negated: bool) -> str:
        text = _with_sentence(text, _duration_sentence(media, negated))
        return _with_sentence(text, _resolution_sentence(media.size, negated, noun="video"))

    system_prompt = _SYSTEM_PROMPT_VIDEO if use_system_prompt else None
    uncond_ids = _encode(tokenizer, with_sentences(negative_prompt, True), system_prompt)
    cond = [torch.tensor(_encode(tokenizer, with_sentences(prompt, False), system_prompt), dtype=torch.long) for prompt in prompts]
    return cond, [torch.tensor(uncond_ids, dtype=torch.long) for _ in prompts]
