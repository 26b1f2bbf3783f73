"""An offline text tokenizer for the tiny Cosmos3 preset, and prompt tokenization.

Cosmos3 has no text encoder: the transformer reads raw token ids. A real checkpoint ships its own
tokenizer in ``text_tokenizer/``; the tiny preset needs one that builds with no download, so this
module makes a byte-level BPE with an empty merge list (every UTF-8 byte is one token) plus the
special tokens the pipeline asks for, wrapped as a ``PreTrainedTokenizerFast`` with a small chat
template in the Qwen style the pipeline expects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from diffusers import Cosmos3OmniPipeline
    from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>")

# `add_vision_id` (passed by the pipeline) is accepted and ignored: jinja ignores unknown kwargs.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tiny_tokenizer() -> "PreTrainedTokenizerFast":
    """A 261-token byte-level tokenizer (256 bytes + 5 specials) that needs no download.

    Deterministic: the byte symbols are numbered in sorted order, the specials after them.
    """
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS),
        chat_template=CHAT_TEMPLATE,
    )


def tokenize_prompt(
    pipe: "Cosmos3OmniPipeline",
    prompt: str,
    *,
    height: int,
    width: int,
    negative_prompt: str | None = None,
) -> tuple[list[int], list[int]]:
    """``(cond_ids, uncond_ids)`` for one text-to-image prompt, exactly as the pipeline builds them.

    Uses the pipeline's own templates (system prompt, resolution sentence and its inverse for the
    negative prompt, EOS and ``<|vision_start|>`` appended), so a packed forward sees the same
    token ids as a ``pipe(...)`` call with ``num_frames=1``.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    return pipe.tokenize_prompt(
        prompt,
        negative_prompt,
        num_frames=1,
        height=height,
        width=width,
    )
