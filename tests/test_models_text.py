"""Our prompt tokenization must give the ids the diffusers pipeline feeds the model."""

from __future__ import annotations

import pytest
from _models_helpers import stock_pipeline

from cosmos_rl.models.build import build_preset
from cosmos_rl.models.text import tokenize_prompts

PROMPTS = ["a cat", "A photo of a dog.", "", "trailing dots...", "déjà vu — 東京"]


@pytest.fixture(scope="module")
def parts():
    return build_preset("tiny", seed=0)


@pytest.fixture(scope="module")
def pipe(parts):
    return stock_pipeline(parts)


@pytest.mark.parametrize("resolution", [(32, 32), (48, 64)])
def test_matches_the_pipeline_with_its_resolution_sentence(parts, pipe, resolution):
    cond, uncond = tokenize_prompts(parts.tokenizer, PROMPTS, resolution=resolution)
    height, width = resolution
    for prompt, got_cond, got_uncond in zip(PROMPTS, cond, uncond):
        expected_cond, expected_uncond = pipe.tokenize_prompt(prompt, num_frames=1, height=height, width=width)
        assert got_cond.tolist() == expected_cond
        assert got_uncond.tolist() == expected_uncond


def test_without_resolution_matches_the_pipeline_without_the_template(parts, pipe):
    cond, uncond = tokenize_prompts(parts.tokenizer, PROMPTS)
    for prompt, got_cond, got_uncond in zip(PROMPTS, cond, uncond):
        expected = pipe.tokenize_prompt(prompt, num_frames=1, height=32, width=32, add_resolution_template=False)
        assert (got_cond.tolist(), got_uncond.tolist()) == expected


def test_negative_prompt_and_no_system_prompt_match_the_pipeline(parts, pipe):
    cond, uncond = tokenize_prompts(
        parts.tokenizer, ["a cat"], resolution=(32, 32), negative_prompt="blurry", use_system_prompt=False
    )
    expected = pipe.tokenize_prompt(
        "a cat", negative_prompt="blurry", num_frames=1, height=32, width=32, use_system_prompt=False
    )
    assert (cond[0].tolist(), uncond[0].tolist()) == expected


def test_ids_end_with_eos_then_vision_start(parts):
    cond, uncond = tokenize_prompts(parts.tokenizer, ["a cat"])
    tail = [parts.tokenizer.eos_token_id, parts.tokenizer.convert_tokens_to_ids("<|vision_start|>")]
    assert cond[0][-2:].tolist() == tail and uncond[0][-2:].tolist() == tail
    assert cond[0].dtype.is_floating_point is False and cond[0].dim() == 1


def test_a_single_string_is_rejected(parts):
    with pytest.raises(TypeError):
        tokenize_prompts(parts.tokenizer, "a cat")
