import json

import numpy as np
import pytest
import torch
from PIL import Image

from _image_helpers import bomb_png

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data.pairs import JsonlPairs, PairSource
from cosmos_rl.core.errors import UserError


def _png(path, rgb, size=8):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size, 3), rgb, dtype=np.uint8)).save(path)
    return path


def _jsonl(path, rows):
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def images(tmp_path):
    _png(tmp_path / "img" / "w1.png", (255, 0, 0))
    _png(tmp_path / "img" / "l1.png", (0, 0, 255))
    _png(tmp_path / "img" / "w2.png", (0, 255, 0))
    _png(tmp_path / "img" / "l2.png", (0, 0, 0))
    return tmp_path


def _row(pair_id, winner="img/w1.png", loser="img/l1.png", **extra):
    return {"id": pair_id, "prompt": f"prompt {pair_id}", "winner": winner, "loser": loser, **extra}


def test_reads_pairs_with_relative_and_absolute_paths(images):
    path = _jsonl(
        images / "pairs.jsonl",
        [_row("a"), _row("b", winner=str(images / "img" / "w2.png"), loser="img/l2.png", score=3)],
    )
    source = JsonlPairs(path, MediaSpec.image(8))
    assert isinstance(source, PairSource)
    assert len(source) == 2
    assert source.membership_ids() == ["a", "b"]
    first, second = source[0], source[1]
    assert first.id == "a" and first.prompt == "prompt a"
    assert torch.equal(first.winner[:, 0, 0], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(first.loser[:, 0, 0], torch.tensor([0.0, 0.0, 1.0]))
    assert torch.equal(second.winner[:, 3, 3], torch.tensor([0.0, 1.0, 0.0]))
    assert second.loser.shape == (3, 8, 8)
    with pytest.raises(IndexError):
        source[2]


def test_images_are_resized_to_image_size(images):
    source = JsonlPairs(_jsonl(images / "pairs.jsonl", [_row("a")]), MediaSpec.image(4))
    assert source[0].winner.shape == (3, 4, 4)


@pytest.mark.parametrize("tie", [{"tie": True}, {"label": 0.5}, {"label": 0}])
def test_tie_markers_are_rejected_naming_file_and_line(images, tie):
    path = _jsonl(images / "pairs.jsonl", [_row("a"), _row("b", **tie)])
    with pytest.raises(UserError, match=r"pairs\.jsonl:2: row carries .*tie"):
        JsonlPairs(path, MediaSpec.image(8))


def test_explicit_non_tie_markers_are_accepted(images):
    path = _jsonl(images / "pairs.jsonl", [_row("a", tie=False), _row("b", label=1)])
    assert JsonlPairs(path, MediaSpec.image(8)).membership_ids() == ["a", "b"]


def test_malformed_json_names_file_and_line_after_blank_lines(images):
    path = _jsonl(images / "pairs.jsonl", [_row("a"), "", '{"id": "b", "prompt": '])
    with pytest.raises(UserError, match=r"pairs\.jsonl:3: malformed JSON"):
        JsonlPairs(path, MediaSpec.image(8))


@pytest.mark.parametrize("field", ["id", "prompt", "winner", "loser"])
def test_missing_field_is_rejected(images, field):
    row = _row("a")
    del row[field]
    path = _jsonl(images / "pairs.jsonl", [row])
    with pytest.raises(UserError, match=rf"pairs\.jsonl:1: missing field '{field}'"):
        JsonlPairs(path, MediaSpec.image(8))


def test_non_object_row_and_numeric_id_are_rejected(images):
    with pytest.raises(UserError, match=r"pairs\.jsonl:1: expected a JSON object"):
        JsonlPairs(_jsonl(images / "pairs.jsonl", ["[1, 2]"]), MediaSpec.image(8))
    with pytest.raises(UserError, match=r"pairs\.jsonl:1: field 'id' must be a non-empty string"):
        JsonlPairs(_jsonl(images / "pairs.jsonl", [_row(7)]), MediaSpec.image(8))


def test_duplicate_id_names_both_lines(images):
    path = _jsonl(images / "pairs.jsonl", [_row("a"), _row("b"), _row("a")])
    with pytest.raises(UserError, match=r"pairs\.jsonl:3: duplicate id 'a' \(first at line 1\)"):
        JsonlPairs(path, MediaSpec.image(8))


def test_missing_image_file_is_rejected_at_construction(images):
    path = _jsonl(images / "pairs.jsonl", [_row("a", loser="img/gone.png")])
    with pytest.raises(UserError, match=r"pairs\.jsonl:1: loser image .*gone\.png does not exist"):
        JsonlPairs(path, MediaSpec.image(8))


def test_winner_equal_to_loser_is_rejected_even_when_spelled_differently(images):
    path = _jsonl(images / "pairs.jsonl", [_row("a", winner="img/w1.png", loser="./img/../img/w1.png")])
    with pytest.raises(UserError, match=r"pairs\.jsonl:1: winner and loser are the same file"):
        JsonlPairs(path, MediaSpec.image(8))


def test_corrupt_image_fails_only_when_read_and_names_file_line(images):
    (images / "img" / "l2.png").write_bytes(b"\x89PNG garbage")
    source = JsonlPairs(_jsonl(images / "pairs.jsonl", [_row("a"), _row("b", "img/w2.png", "img/l2.png")]), MediaSpec.image(8))
    assert source.membership_ids() == ["a", "b"]
    source[0]
    with pytest.raises(UserError, match=r"pairs\.jsonl:2 \(id 'b'\) loser: .*l2\.png: cannot decode image"):
        source[1]


def test_a_decompression_bomb_in_a_row_names_file_line_and_image(images):
    (images / "img" / "huge.png").write_bytes(bomb_png())
    source = JsonlPairs(_jsonl(images / "pairs.jsonl", [_row("a"), _row("b", winner="img/huge.png")]), MediaSpec.image(8))
    with pytest.raises(UserError, match=r"pairs\.jsonl:2 \(id 'b'\) winner: .*huge\.png: cannot decode image: too large"):
        source[1]


def test_membership_ids_do_not_touch_images(images):
    source = JsonlPairs(_jsonl(images / "pairs.jsonl", [_row("a"), _row("b", "img/w2.png", "img/l2.png")]), MediaSpec.image(8))
    for png in (images / "img").iterdir():
        png.unlink()
    assert source.membership_ids() == ["a", "b"]
    assert len(source) == 2


def test_missing_and_empty_files_are_rejected(tmp_path):
    with pytest.raises(UserError, match="preference JSONL not found"):
        JsonlPairs(tmp_path / "none.jsonl", MediaSpec.image(8))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(UserError, match=r"empty\.jsonl: no preference rows"):
        JsonlPairs(tmp_path / "empty.jsonl", MediaSpec.image(8))
