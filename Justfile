# Developer shortcuts; the README's two commands work without `just` (it comes with the dev extra).

setup:
    python3 -m pip install torch==2.13.0
    python3 -m pip install -e '.[dev]'

test *ARGS:
    python3 -m pytest -q {{ARGS}}

# Every speed figure of docs/benchmarks.md as JSON, on CPU (the GPU check at tiny size; on a GPU: `just gpu-check`).
bench:
    python3 bench/validate_bench.py
    python3 bench/dpo_bench.py
    python3 bench/nft_bench.py --memory
    python3 bench/coldstart_bench.py
    python3 bench/gpu_check.py --size tiny --device cpu

# The GPU check (one GPU, Nano-like random weights, under 8 minutes); e.g. `just gpu-check --model DIR`.
gpu-check *ARGS:
    python3 bench/gpu_check.py {{ARGS}}

docs:
    python3 -m cosmos_rl.commands.docs_gen > docs/manifest.md

smoke-dpo:
    cosmos-rl train manifests/dpo_t2i_smoke.toml

smoke-nft:
    cosmos-rl train manifests/nft_t2i_smoke.toml
