"""`cosmos-rl validate` reads the data: every bad row, image and shard at once with file:line, a fixed
sample of images by default, all of them with `--data all`, and still no torch import."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import webdataset as wds

from _image_helpers import bomb_png, png_bytes
from cosmos_rl import cli
from cosmos_rl.data import scan

ROOT = Path(__file__).resolve().parent.parent
DPO = str(ROOT / "manifests" / "dpo_t2i_smoke.toml")
NFT = str(ROOT / "manifests" / "nft_t2i_smoke.toml")


def run_cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.app(list(args))
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


def jsonl_overrides(path: Path) -> list[str]:
    return ["rl.data.synthetic_pairs=0", f'rl.data.jsonl="{path}"', "rl.validation.every=0"]


def _row(pair_id, winner="w.png", loser="l.png"):
    return json.dumps({"id": pair_id, "prompt": f"prompt {pair_id}", "winner": winner, "loser": loser})


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "w.png").write_bytes(png_bytes((255, 0, 0)))
    (tmp_path / "l.png").write_bytes(png_bytes((0, 0, 255)))
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    (tmp_path / "huge.png").write_bytes(bomb_png())
    (tmp_path / "cut.png").write_bytes(png_bytes((0, 255, 0), size=16)[:-20])
    return tmp_path


def test_every_bad_row_and_image_is_listed_at_once_with_file_and_line(capsys, folder):
    rows = [
        _row("a"),
        '{"id": "b",',
        _row("c", winner="gone.png"),
        _row("a"),
        _row("e", winner="junk.png"),
        _row("f", loser="huge.png"),
        _row("g", winner="cut.png"),
    ]
    data = folder / "pairs.jsonl"
    data.write_text("\n".join(rows) + "\n")
    rc, _, err = run_cli(capsys, "validate", DPO, *jsonl_overrides(data))
    assert rc == 2
    expected = {
        2: "malformed JSON",
        3: "winner image",
        4: "duplicate id 'a' (first at line 1)",
        5: "winner: " + str(folder / "junk.png") + ": cannot decode image: not a format Pillow identifies",
        6: "loser: " + str(folder / "huge.png") + ": cannot decode image: too large to decode safely",
        7: "winner: " + str(folder / "cut.png") + ": cannot decode image: damaged PNG data",
    }
    lines = [line for line in err.splitlines() if line.startswith("  rl.data.jsonl: ")]
    assert len(lines) == len(expected), err
    for number, text in expected.items():
        assert any(f"{data}:{number}" in line and text in line for line in lines), (number, err)
    assert "Traceback" not in err


def test_the_default_sample_misses_a_bad_image_that_data_all_finds(capsys, folder):
    count = 300
    bad = next(i for i in range(count) if i not in set(scan.sample_rows(count, full=False)))
    rows = [_row(f"p{i}", winner="junk.png" if i == bad else "w.png") for i in range(count)]
    data = folder / "pairs.jsonl"
    data.write_text("\n".join(rows) + "\n")
    rc, out, _ = run_cli(capsys, "validate", DPO, *jsonl_overrides(data))
    assert rc == 0
    assert f"rl.data.jsonl: {count} good rows, 0 bad; images of 128 of {count} rows opened" in out
    rc, _, err = run_cli(capsys, "validate", DPO, *jsonl_overrides(data), "--data", "all")
    assert rc == 2 and f"{data}:{bad + 1} (id 'p{bad}') winner" in err
    rc, _, _ = run_cli(capsys, "validate", DPO, *jsonl_overrides(data), "--data", "none")
    assert rc == 0


def test_the_sample_is_the_head_plus_a_fixed_draw():
    chosen = scan.sample_rows(10_000, full=False)
    assert chosen[: scan.SAMPLE_HEAD] == list(range(scan.SAMPLE_HEAD))
    assert len(chosen) == scan.SAMPLE_HEAD + scan.SAMPLE_DRAWN == len(set(chosen))
    assert chosen == scan.sample_rows(10_000, full=False)
    assert scan.sample_rows(100, full=False) == list(range(100))
    assert scan.sample_rows(10_000, full=True) == list(range(10_000))


def _shard(path: Path, samples: list[dict]) -> Path:
    with wds.TarWriter(str(path)) as writer:
        for sample in samples:
            writer.write(sample)
    return path


def _sample(key, loser=None):
    return {"__key__": key, "json": {"id": key, "prompt": "p"}, "winner.png": png_bytes(), "loser.png": loser or png_bytes((0, 0, 255))}


def test_every_bad_shard_and_sample_is_listed_at_once(capsys, tmp_path):
    good = _shard(tmp_path / "a.tar", [_sample("k0"), _sample("k1", loser=b"junk")])
    full = _shard(tmp_path / "b.tar", [_sample("k2"), _sample("k3")])
    (tmp_path / "c.tar").write_bytes(full.read_bytes()[:5000])
    overrides = ["rl.data.synthetic_pairs=0", f'rl.data.shards=["{good}", "{tmp_path / "c.tar"}"]', "rl.validation.every=0"]
    rc, _, err = run_cli(capsys, "validate", DPO, *overrides)
    assert rc == 2
    assert f"rl.data.shards: {good} sample 'k1' (id 'k1') loser: cannot decode image" in err
    assert f"rl.data.shards: {tmp_path / 'c.tar'}: truncated" in err


def test_every_bad_prompt_row_is_listed(capsys, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red square"}\n{"prompt": ""}\nnot json\n')
    rc, _, err = run_cli(capsys, "validate", NFT, f'rl.prompts.file="{prompts}"')
    assert rc == 2 and f"{prompts}:2" in err and f"{prompts}:3: malformed JSON" in err


def test_validate_reads_jsonl_data_without_importing_torch(folder):
    data = folder / "pairs.jsonl"
    data.write_text(_row("a") + "\n")
    code = (
        "import sys\nfrom cosmos_rl.cli import app\n"
        f"try:\n    app(['validate', {DPO!r}, *{jsonl_overrides(data)!r}])\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'diffusers', 'transformers', 'peft', 'webdataset') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "EXIT 0" in result.stdout and "HEAVY []" in result.stdout, result.stdout + result.stderr
    assert "images of all 1 rows opened" in result.stdout
