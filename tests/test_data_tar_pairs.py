import io
import tarfile

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data.pairs import PairSource, TarShardPairs
from cosmos_rl.core.errors import UserError


def _encoded(rgb, fmt="PNG", size=8):
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), rgb, dtype=np.uint8)).save(buffer, format=fmt)
    return buffer.getvalue()


def _sample(key, pair_id, winner_rgb=(255, 0, 0), loser_rgb=(0, 0, 255), **meta):
    return {
        "__key__": key,
        "json": {"id": pair_id, "prompt": f"prompt {pair_id}", **meta},
        "winner.png": _encoded(winner_rgb),
        "loser.png": _encoded(loser_rgb),
    }


def _shard(path, samples):
    with wds.TarWriter(str(path)) as writer:
        for sample in samples:
            writer.write(sample)
    return path


def test_round_trip_over_a_brace_pattern(tmp_path):
    _shard(tmp_path / "pairs-000.tar", [_sample("k0", "a"), _sample("k1", "b", (0, 255, 0), (0, 0, 0))])
    _shard(tmp_path / "pairs-001.tar", [_sample("k2", "c", winner_prompt="prompt c")])
    source = TarShardPairs(str(tmp_path / "pairs-{000..001}.tar"), MediaSpec.image(8))
    assert isinstance(source, PairSource)
    assert len(source) == 3
    assert source.membership_ids() == ["a", "b", "c"]
    pair = source[1]
    assert pair.id == "b" and pair.prompt == "prompt b"
    assert torch.equal(pair.winner[:, 2, 2], torch.tensor([0.0, 1.0, 0.0]))
    assert torch.equal(pair.loser, torch.zeros(3, 8, 8))
    assert torch.equal(source[2].winner[:, 0, 0], torch.tensor([1.0, 0.0, 0.0]))
    sides = source.prompt_sides()
    assert sides[2].winner_prompt == "prompt c" and sides[2].loser_prompt is None
    assert "pairs-001.tar sample 'k2'" in sides[2].origin


def test_list_of_paths_and_jpeg_members(tmp_path):
    sample = _sample("k0", "a")
    sample["winner.jpg"] = _encoded((255, 255, 255), "JPEG")
    del sample["winner.png"]
    shard = _shard(tmp_path / "s.tar", [sample])
    pair = TarShardPairs([shard], MediaSpec.image(4))[0]
    assert pair.winner.shape == (3, 4, 4)
    assert pair.winner.min() > 0.95


def test_corrupt_image_indexes_and_fails_on_read_naming_shard_and_key(tmp_path):
    bad = _sample("k1", "b")
    bad["loser.png"] = b"\x89PNG truncated"
    source = TarShardPairs(_shard(tmp_path / "s.tar", [_sample("k0", "a"), bad]), MediaSpec.image(8))
    assert source.membership_ids() == ["a", "b"]
    source[0]
    with pytest.raises(UserError, match=r"s\.tar sample 'k1' \(id 'b'\) loser: cannot decode image"):
        source[1]


def test_missing_side_names_shard_key_and_members(tmp_path):
    sample = _sample("k0", "a")
    del sample["loser.png"]
    with pytest.raises(UserError, match=r"s\.tar sample 'k0': no loser image.*members: json, winner\.png"):
        TarShardPairs(_shard(tmp_path / "s.tar", [sample]), MediaSpec.image(8))


def test_two_winner_images_are_ambiguous(tmp_path):
    sample = _sample("k0", "a")
    sample["winner.jpg"] = _encoded((0, 0, 0), "JPEG")
    with pytest.raises(UserError, match=r"sample 'k0': 2 \(winner\.png, winner\.jpg\) winner image"):
        TarShardPairs(_shard(tmp_path / "s.tar", [sample]), MediaSpec.image(8))


def test_tie_in_json_is_rejected(tmp_path):
    with pytest.raises(UserError, match=r"s\.tar sample 'k0': row carries \"tie\": True"):
        TarShardPairs(_shard(tmp_path / "s.tar", [_sample("k0", "a", tie=True)]), MediaSpec.image(8))


def test_missing_json_and_missing_prompt(tmp_path):
    sample = _sample("k0", "a")
    del sample["json"]
    with pytest.raises(UserError, match=r"sample 'k0': no 'json' member"):
        TarShardPairs(_shard(tmp_path / "a.tar", [sample]), MediaSpec.image(8))
    sample = _sample("k0", "a")
    del sample["json"]["prompt"]
    with pytest.raises(UserError, match=r"b\.tar sample 'k0': missing field 'prompt'"):
        TarShardPairs(_shard(tmp_path / "b.tar", [sample]), MediaSpec.image(8))


def test_duplicate_id_across_shards(tmp_path):
    first = _shard(tmp_path / "a.tar", [_sample("k0", "same")])
    second = _shard(tmp_path / "b.tar", [_sample("k9", "same")])
    expected = r"b\.tar sample 'k9': duplicate id 'same' \(first in .*a\.tar sample 'k0'\)"
    with pytest.raises(UserError, match=expected):
        TarShardPairs([first, second], MediaSpec.image(8))


def test_split_sample_key_is_rejected(tmp_path):
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as archive:
        members = [("k0.json", b'{"id": "a", "prompt": "p"}'), ("k1.json", b"{}"), ("k0.winner.png", b"x")]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with pytest.raises(UserError, match=r"sample 'k0': its members are not consecutive"):
        TarShardPairs(path, MediaSpec.image(8))


def test_remote_compressed_and_missing_shards_are_rejected(tmp_path):
    with pytest.raises(UserError, match="needs a local shard"):
        TarShardPairs(["s3://bucket/pairs-000.tar"], MediaSpec.image(8))
    with pytest.raises(UserError, match="tar shard not found"):
        TarShardPairs([tmp_path / "nope.tar"], MediaSpec.image(8))
    gz = tmp_path / "s.tar.gz"
    with tarfile.open(gz, "w:gz") as archive:
        info = tarfile.TarInfo("k0.json")
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(UserError, match=r"s\.tar\.gz: not an uncompressed tar file"):
        TarShardPairs([gz], MediaSpec.image(8))


def _cut(path, size, out):
    out.write_bytes(path.read_bytes()[:size])
    return out


def test_a_truncated_shard_is_refused_naming_it(tmp_path):
    full = _shard(tmp_path / "full.tar", [_sample(f"k{i}", f"id{i}") for i in range(3)])
    with tarfile.open(full) as archive:
        members = archive.getmembers()
    # Cut inside a member's data: tarfile raises ReadError while indexing.
    inside = _cut(full, members[4].offset_data + 10, tmp_path / "inside.tar")
    with pytest.raises(UserError, match=r"inside\.tar: truncated"):
        TarShardPairs([inside], MediaSpec.image(8))
    # Cut exactly where a member header starts: tarfile itself stops there without a word.
    on_header = _cut(full, members[5].offset, tmp_path / "header.tar")
    with pytest.raises(UserError, match=r"header\.tar: truncated: no end-of-archive block after 'k1\.loser\.png'"):
        TarShardPairs([on_header], MediaSpec.image(8))


def test_brace_patterns_expand_inside_a_list_of_shards(tmp_path):
    _shard(tmp_path / "p-0.tar", [_sample("k0", "a")])
    _shard(tmp_path / "p-1.tar", [_sample("k1", "b")])
    _shard(tmp_path / "q.tar", [_sample("k2", "c")])
    source = TarShardPairs([str(tmp_path / "p-{0..1}.tar"), tmp_path / "q.tar"], MediaSpec.image(8))
    assert source.membership_ids() == ["a", "b", "c"]


# ------------------------------------------------------------------- clip pairs' recorded SHA-256
def _clip_pairs(out):
    """Two clip pairs as `pairs mine` writes them (its PairShardWriter), in one shard."""
    from _clip_helpers import squares_clip

    from cosmos_rl.commands.mining.shards import PairShardWriter

    writer = PairShardWriter(out, per_shard=4, fps=24.0)
    for index in range(2):
        clip = np.roll(squares_clip(), index, axis=2)
        writer.add({"id": f"p{index}", "prompt": f"prompt {index}"}, clip, clip[:, ::-1].copy())
    return writer.close()


def test_mined_clip_pairs_record_both_sides_sha256_and_write_byte_identical_shards(tmp_path):
    import hashlib
    import json

    shards = _clip_pairs(tmp_path / "a")
    assert [p.read_bytes() for p in shards] == [p.read_bytes() for p in _clip_pairs(tmp_path / "b")]
    with tarfile.open(shards[0]) as tar:
        meta = json.loads(tar.extractfile("00000001.json").read())
        sides = {side: tar.extractfile(f"00000001.{side}").read() for side in ("winner.mp4", "loser.mp4")}
    assert meta["sha256"] == {side: hashlib.sha256(data).hexdigest() for side, data in sides.items()}
    pairs = TarShardPairs([str(p) for p in shards], MediaSpec(9, 32, 32))
    assert [pairs[i].winner.shape for i in range(2)] == [(3, 9, 32, 32)] * 2


def test_a_silently_decoding_flip_in_a_mined_clip_pair_is_refused_naming_the_member(tmp_path):
    import hashlib

    from _clip_helpers import flip_member_byte, silent_flip

    from cosmos_rl.data import scan
    from cosmos_rl.data.clips import decode_clip

    shards = _clip_pairs(tmp_path)
    with tarfile.open(shards[0]) as tar:
        clip = tar.extractfile("00000000.loser.mp4").read()
    damaged = flip_member_byte(shards[0], "00000000.loser.mp4", silent_flip(clip, 9, 32, 32))
    assert not torch.equal(decode_clip(damaged, 9, 32, 32, "x"), decode_clip(clip, 9, 32, 32, "x"))  # FFmpeg: no error
    pairs = TarShardPairs([str(shards[0])], MediaSpec(9, 32, 32))
    assert pairs[1].id == "p1"
    with pytest.raises(UserError) as refused:
        pairs[0]
    message = str(refused.value)
    assert message.startswith(f"{shards[0]} sample '00000000' (id 'p0') loser: member 'loser.mp4' is damaged: its SHA-256 is "
                              f"{hashlib.sha256(damaged).hexdigest()}, the sample's json records {hashlib.sha256(clip).hexdigest()}")
    assert "write the shards again" in message

    class Data:  # validate --data reads the same member the same way
        synthetic_pairs, jsonl, shards, factory = False, "", [str(tmp_path / "pairs-000000.tar")], ""

    problems, _ = scan._pairs("rl.data", Data(), tmp_path, False, (9, 32, 32))
    assert [p.render() for p in problems] == [f"rl.data.shards: {message}"]


def test_clip_pairs_without_recorded_digests_read_as_before(tmp_path):
    """A user's own clip pairs (no sha256 in the json) are decoded unverified, as before."""
    from _clip_helpers import squares_mp4

    clip = squares_mp4()
    sample = {"__key__": "k0", "json": {"id": "a", "prompt": "p"}, "winner.mp4": clip, "loser.mp4": clip}
    pair = TarShardPairs(_shard(tmp_path / "own.tar", [sample]), MediaSpec(9, 32, 32))[0]
    assert torch.equal(pair.winner, pair.loser) and pair.winner.shape == (3, 9, 32, 32)
