"""Weight-free reward functions on hand-made images."""

import io

import numpy as np
import pytest
from PIL import Image

from cosmos_rl.rewards.functions import (
    REWARDS,
    brightness,
    colour_named_in,
    jpeg_compressibility,
    jpeg_incompressibility,
    prompt_colour,
    to_uint8,
)


def _flat_and_noise():
    flat = np.full((1, 64, 64, 3), 100, dtype=np.uint8)
    noise = np.random.default_rng(0).integers(0, 256, size=(1, 64, 64, 3), dtype=np.uint8)
    return np.concatenate([flat, noise])


def test_flat_image_is_more_compressible_than_noise():
    images = _flat_and_noise()
    comp = jpeg_compressibility(images, ["a", "b"])
    incomp = jpeg_incompressibility(images, ["a", "b"])
    assert comp[0] > comp[1]
    assert incomp[0] < incomp[1]
    assert comp == [-x for x in incomp]


def test_jpeg_size_is_kilobytes_of_a_quality_95_jpeg():
    """DDPO's definition: bytes of a quality-95 Pillow JPEG / 1000."""
    images = _flat_and_noise()
    buffer = io.BytesIO()
    Image.fromarray(images[1]).save(buffer, format="JPEG", quality=95)
    assert jpeg_incompressibility(images[1:], ["x"]) == [len(buffer.getvalue()) / 1000.0]
    # quality matters: a quality-50 file of noise is clearly smaller, so 95 is really used
    low = io.BytesIO()
    Image.fromarray(images[1]).save(low, format="JPEG", quality=50)
    assert len(low.getvalue()) / 1000.0 < jpeg_incompressibility(images[1:], ["x"])[0]


def test_to_uint8_rounds_and_clips():
    """0 -> 0, 0.2 -> 51, 1 -> 255, 1.2 -> clipped 255, -0.1 -> clipped 0,
    0.003 * 255 = 0.765 -> rounds to 1 (truncation would give 0)."""
    got = to_uint8(np.array([0.0, 0.2, 1.0, 1.2, -0.1, 0.003]))
    assert got.dtype == np.uint8
    assert got.tolist() == [0, 51, 255, 255, 0, 1]


def test_brightness():
    """All pixels 51 -> 51/255 = 0.2; all 255 -> 1."""
    images = np.stack([np.full((4, 4, 3), 51, np.uint8), np.full((4, 4, 3), 255, np.uint8)])
    assert brightness(images, ["", ""]) == pytest.approx([0.2, 1.0])


def test_prompt_colour():
    """A flat red image under "a red apple" scores 1.
    A flat black image under "Red car": distance per channel [255, 0, 0], mean 85 -> 1 - 85/255 = 2/3.
    A flat blue image under "the sky is blue, not red": first colour word is blue -> 1."""
    red = np.zeros((4, 4, 3), np.uint8)
    red[..., 0] = 255
    black = np.zeros((4, 4, 3), np.uint8)
    blue = np.zeros((4, 4, 3), np.uint8)
    blue[..., 2] = 255
    got = prompt_colour(np.stack([red, black, blue]),
                        ["a red apple", "Red car", "the sky is blue, not red"])
    assert got == pytest.approx([1.0, 2 / 3, 1.0])


def test_prompt_without_colour_is_rejected():
    assert colour_named_in("A GREY cat") == (128, 128, 128)
    with pytest.raises(ValueError, match="names no colour"):
        prompt_colour(np.zeros((1, 2, 2, 3), np.uint8), ["a reddish cat"])


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="uint8"):
        brightness(np.zeros((1, 2, 2, 3), np.float32), ["a"])
    with pytest.raises(ValueError, match="N, H, W, 3"):
        brightness(np.zeros((1, 2, 2), np.uint8), ["a"])
    with pytest.raises(ValueError, match="1 images but 2 prompts"):
        brightness(np.zeros((1, 2, 2, 3), np.uint8), ["a", "b"])


def test_registry_names_and_signature():
    from cosmos_rl.rewards.registry import builtin_rewards

    # 32 px and colour-naming shapes captions: inputs every built-in image reward accepts
    images = np.zeros((2, 32, 32, 3), np.uint8)
    assert set(REWARDS) == {"jpeg_compressibility", "jpeg_incompressibility", "brightness", "prompt_colour"}  # weight-free
    image_rewards = {name: r.fn for name, r in builtin_rewards().items() if r.modalities == ("image",)}
    assert set(image_rewards) == {*REWARDS, "shapes_strict", "shapes_partial"}  # and the shapes suite's, through the suite
    for name, fn in image_rewards.items():
        scores = fn(images, ["a red circle", "two blue squares"])
        assert len(scores) == 2 and all(isinstance(s, float) for s in scores), name


def test_the_one_pixel_conversion_rounds_the_exact_x255_and_comes_back_exactly():
    # The reward wire, eval and mining samples all cross data.pixels.to_uint8: a float32 pixel is
    # scaled exactly (float64), then rounded to nearest, here checked against exact fractions at
    # the float32 neighbours of every half level, where float32 scaling would round wrongly.
    from fractions import Fraction

    import torch

    from cosmos_rl.data.pixels import to_uint8 as one_conversion
    from cosmos_rl.data.pixels import to_unit_float

    assert to_uint8 is one_conversion
    halves = np.array([(k + 0.5) / 255 for k in range(255)], dtype=np.float32)
    near = np.concatenate([np.nextafter(halves, 0), halves, np.nextafter(halves, 1)]).astype(np.float32)
    exact = [min(255, max(0, round(Fraction(float(x)) * 255))) for x in near]
    assert one_conversion(near).tolist() == exact
    levels = np.arange(256, dtype=np.uint8)
    back = to_unit_float(levels)
    assert back.dtype == np.float32
    assert np.array_equal(back, (torch.from_numpy(levels).float() / 255).numpy())
    assert np.array_equal(one_conversion(back), levels)
