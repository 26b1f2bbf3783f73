"""A tiny tokenizer that the diffusers Cosmos3 pipeline accepts, built without any download.

Cosmos3 reads raw token ids (no text encoder), so all the pipeline needs from a tokenizer is:
a chat template it can call with `add_vision_id=False`, an EOS id and the `<|vision_start|>`
token. A byte-level BPE with no merges gives every byte its own id, so any prompt encodes.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>")

# Qwen-style turns: "<|im_start|>role\ncontent<|im_end|>\n", then an open assistant turn when the
# caller asks for a generation prompt. Extra keyword arguments (add_vision_id) are ignored.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 256 byte symbols then the special tokens; identical on every call."""
    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(byte_symbols)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
