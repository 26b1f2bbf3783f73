import json

import numpy as np
import pytest
import torch
from PIL import Image

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data.pairs import (
    JsonlPairs,
    PromptSides,
    SyntheticPairs,
    check_source_symmetry,
    check_symmetry,
)
from cosmos_rl.core.errors import UserError


def whitespace_tokenizer(text):
    """Stand-in tokenizer: ids of lower-cased words, so spacing and case do not matter."""
    return [sum(map(ord, word)) for word in text.lower().split()]


def test_rows_tokenizing_alike_pass_and_are_counted():
    rows = [
        PromptSides("a", "f:1", "a red square", "a  red square", "A red square"),
        PromptSides("b", "f:2", "a blue circle", None, None),  # single prompt: nothing to compare
        PromptSides("c", "f:3", "a blue circle", None, "a blue circle"),
    ]
    assert check_symmetry(rows, whitespace_tokenizer) == 2


def test_mismatched_side_names_row_and_side():
    rows = [
        PromptSides("a", "f:1", "a red square", "a red square", "a red square"),
        PromptSides("b", "pairs.jsonl:2", "a red square", "a red square", "a green square"),
    ]
    with pytest.raises(UserError, match=r"pairs\.jsonl:2 \(id 'b'\): loser_prompt 'a green square'"):
        check_symmetry(rows, whitespace_tokenizer)


def test_side_differing_from_the_trained_prompt_is_caught_even_if_sides_agree():
    rows = [PromptSides("a", "f:1", "a red square", "a cat", "a cat")]
    with pytest.raises(UserError, match="winner_prompt 'a cat' does not tokenize like prompt"):
        check_symmetry(rows, whitespace_tokenizer)


def test_tensor_returning_tokenizer_is_compared_by_value():
    rows = [PromptSides("a", "f:1", "x y", "x y", "x z")]
    with pytest.raises(UserError, match="loser_prompt"):
        check_symmetry(rows, lambda text: torch.tensor(whitespace_tokenizer(text)))


def test_jsonl_source_symmetry_fails_naming_file_line(tmp_path):
    for name in ("w.png", "l.png"):
        Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / name)
    rows = [
        {"id": "a", "prompt": "a red square", "winner": "w.png", "loser": "l.png"},
        {"id": "b", "prompt": "a red square", "winner": "w.png", "loser": "l.png",
         "winner_prompt": "a red square", "loser_prompt": "a red circle"},
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))
    with pytest.raises(UserError, match=r"pairs\.jsonl:2 \(id 'b'\): loser_prompt 'a red circle'"):
        check_source_symmetry(JsonlPairs(path, MediaSpec.image(4)), whitespace_tokenizer)


def test_single_prompt_sources_have_nothing_to_check():
    calls = []
    assert check_source_symmetry(SyntheticPairs(3, MediaSpec.image(8), 0), lambda text: calls.append(text) or [1]) == 0
    assert calls == []
