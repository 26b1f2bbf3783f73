# Developer shortcuts; the README's two commands work without `just` (it comes with the dev extra).

setup:
    python3 -m pip install torch==2.13.0
    python3 -m pip install -e '.[dev]'

test *ARGS:
    python3 -m pytest -q {{ARGS}}

bench:
    python3 bench/validate_bench.py
    python3 bench/dpo_bench.py
    python3 bench/nft_bench.py

docs:
    python3 -m cosmos_rl.docs_gen > docs/manifest.md

smoke-dpo:
    cosmos-rl train manifests/dpo_t2i_smoke.toml

smoke-nft:
    cosmos-rl train manifests/nft_t2i_smoke.toml
