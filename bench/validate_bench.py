"""How fast `cosmos-rl validate` answers, beside the cost of merely importing torch. Prints JSON.

    python bench/validate_bench.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_COUNT = (
    "import sys\nfrom cosmos_rl.cli import app\n"
    "try:\n    app(['validate', {manifest!r}])\nexcept SystemExit:\n    pass\nprint(len(sys.modules))"
)


def timed(argv: list[str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    manifest = str(ROOT / "manifests" / "nft_t2i_smoke.toml")
    modules = subprocess.run([sys.executable, "-c", MODULE_COUNT.format(manifest=manifest)], capture_output=True, text=True, cwd=ROOT, check=True)
    result = {
        "validate_s_median": round(timed([sys.executable, "-m", "cosmos_rl.cli", "validate", manifest], args.repeat), 3),
        "import_torch_s_median": round(timed([sys.executable, "-c", "import torch"], args.repeat), 3),
        "python_startup_s_median": round(timed([sys.executable, "-c", "pass"], args.repeat), 3),
        "modules_imported_by_validate": int(modules.stdout.strip().splitlines()[-1]),
        "repeat": args.repeat,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
