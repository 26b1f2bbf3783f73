"""What `cosmos-rl validate` pays to read the data, per 10k rows, for a JSONL and a tar source. Prints JSON.

    python bench/validate_data_bench.py [--rows 10000] [--image-side 64] [--repeat 3]

Builds a temporary dataset: a JSONL of `--rows` rows over 256 distinct PNG files (noise, so they do
not compress; warm in the page cache after the first pass, so disk reads are not measured), and one
tar shard of `--rows` samples with their own image bytes. Times `cosmos_rl.config.algorithms.check_data` in
its default sample mode and with `full=True` (`validate --data all`); medians of `--repeat`.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from cosmos_rl.config import load
from cosmos_rl.config import algorithms

ROOT = Path(__file__).resolve().parent.parent
DPO = ROOT / "manifests" / "dpo_t2i_smoke.toml"
DISTINCT_FILES = 256


def _png(rng: np.random.Generator, side: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _build(folder: Path, rows: int, side: int) -> tuple[Path, Path, int]:
    rng = np.random.default_rng(0)
    images = [_png(rng, side) for _ in range(DISTINCT_FILES)]
    for i, data in enumerate(images):
        (folder / f"{i}.png").write_bytes(data)
    jsonl = folder / "pairs.jsonl"
    with jsonl.open("w") as f:
        for r in range(rows):
            winner, loser = (2 * r) % DISTINCT_FILES, (2 * r + 1) % DISTINCT_FILES
            f.write(json.dumps({"id": f"p{r}", "prompt": "a red square", "winner": f"{winner}.png", "loser": f"{loser}.png"}) + "\n")
    shard = folder / "pairs.tar"
    with tarfile.open(shard, "w") as archive:
        for r in range(rows):
            members = (("json", json.dumps({"id": f"p{r}", "prompt": "a red square"}).encode()),
                       ("winner.png", images[(2 * r) % DISTINCT_FILES]), ("loser.png", images[(2 * r + 1) % DISTINCT_FILES]))
            for ext, data in members:
                info = tarfile.TarInfo(f"s{r:07d}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return jsonl, shard, len(images[0])


def _median_s(config, base: Path, full: bool, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        problems, _ = algorithms.check_data(config, base, full=full)
        samples.append(time.perf_counter() - start)
        assert not problems, problems[:3]
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--image-side", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    per_10k = 10_000 / args.rows
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        jsonl, shard, png_size = _build(folder, args.rows, args.image_side)
        result = {"rows": args.rows, "image_side": args.image_side, "png_bytes": png_size, "repeat": args.repeat}
        for name, overrides in (("jsonl", [f'rl.data.jsonl="{jsonl}"']), ("tar", [f'rl.data.shards=["{shard}"]'])):
            config = load.load(DPO, ["rl.data.synthetic_pairs=0", "rl.validation.every=0", *overrides])
            for mode, full in (("sample", False), ("all", True)):
                seconds = _median_s(config, folder, full, args.repeat)
                result[f"{name}_{mode}_s_per_10k_rows"] = round(seconds * per_10k, 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
