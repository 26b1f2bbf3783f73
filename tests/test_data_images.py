import numpy as np
import pytest
import torch
from PIL import Image

from _image_helpers import bomb_png

from cosmos_rl.data.images import decode_image, load_image, save_image_grid
from cosmos_rl.core.errors import UserError


def _write(path, array):
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)
    return path


def test_same_size_png_is_used_pixel_exact(tmp_path):
    pixels = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3) * 5
    image = load_image(_write(tmp_path / "a.png", pixels), 4)
    assert image.shape == (3, 4, 4) and image.dtype == torch.float32
    expected = torch.from_numpy(pixels.astype(np.float32) / 255.0).permute(2, 0, 1)
    assert torch.equal(image, expected)


def test_resize_covers_then_centre_crops_without_stretching(tmp_path):
    # 64 wide x 32 high: blue outer quarters, green middle half. Covering 16x16 scales by
    # 0.5 to 32x16 and keeps the middle 16 columns, i.e. the green part only.
    pixels = np.zeros((32, 64, 3), dtype=np.uint8)
    pixels[:, :, 2] = 255
    pixels[:, 16:48] = (0, 255, 0)
    image = load_image(_write(tmp_path / "wide.png", pixels), 16)
    assert image.shape == (3, 16, 16)
    interior = image[:, :, 3:13]  # away from the bicubic ringing at the crop edges
    assert torch.allclose(interior[1], torch.ones_like(interior[1]), atol=0.02)
    assert interior[2].max() < 0.02


def test_non_square_target_and_grayscale_input(tmp_path):
    gray = np.full((10, 10), 128, dtype=np.uint8)
    image = load_image(_write(tmp_path / "g.png", gray), (6, 8))
    assert image.shape == (3, 6, 8)
    assert torch.allclose(image, torch.full_like(image, 128 / 255), atol=1 / 255)


def test_undecodable_bytes_name_their_origin():
    with pytest.raises(UserError, match=r"pairs\.jsonl:7 winner: cannot decode image"):
        decode_image(b"not an image", 8, "pairs.jsonl:7 winner")


def test_unidentifiable_bytes_are_worded_without_pillows_stream_repr():
    with pytest.raises(UserError) as info:
        decode_image(b"", 8, "pairs.jsonl:7 winner")
    assert "not a format Pillow identifies" in str(info.value) and "BytesIO" not in str(info.value)


def test_a_decompression_bomb_is_a_user_error_naming_its_origin(tmp_path):
    path = tmp_path / "huge.png"
    path.write_bytes(bomb_png())
    with pytest.raises(UserError, match=r"rows\.jsonl:4 winner: .*huge\.png: cannot decode image: too large to decode safely \(Image size \(400000000 pixels\)"):
        load_image(path, 8, "rows.jsonl:4 winner")


def test_missing_file_names_origin_and_path(tmp_path):
    with pytest.raises(UserError, match=r"rows\.jsonl:2 loser: image file not found: .*nope\.png; check the path"):
        load_image(tmp_path / "nope.png", 8, "rows.jsonl:2 loser")


def test_save_image_grid_layout_gaps_and_clamping(tmp_path):
    red = torch.zeros(3, 4, 4)
    red[0] = 1.5  # overshoot is clamped to full intensity
    green = torch.zeros(3, 4, 4)
    green[1] = 1.0
    blue = torch.zeros(3, 4, 4)
    blue[2] = 1.0
    path = save_image_grid([red, green, blue], tmp_path / "sub" / "grid.png", nrow=2)
    grid = np.asarray(Image.open(path).convert("RGB"))
    assert grid.shape == (4 + 2 + 4, 4 + 2 + 4, 3)
    assert tuple(grid[0, 0]) == (255, 0, 0)
    assert tuple(grid[0, 6]) == (0, 255, 0)
    assert tuple(grid[6, 0]) == (0, 0, 255)
    assert tuple(grid[4, 4]) == (0, 0, 0)  # gap
    assert tuple(grid[9, 9]) == (0, 0, 0)  # empty fourth cell


def test_save_image_grid_rejects_wrong_shape(tmp_path):
    with pytest.raises(ValueError, match="3, H, W"):
        save_image_grid(torch.zeros(2, 4, 4), tmp_path / "x.png", nrow=1)
