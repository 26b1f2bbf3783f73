"""One-step-off scoring benchmark: NFT step time with a slow reward, in series vs `rl.async_reward`.

Runs the NFT smoke manifest (manifests/nft_t2i_smoke.toml: the tiny model, 4 Ray actors on CPU)
for `--steps` steps against a built-in reward service on 127.0.0.1 whose brightness reward sleeps
`--latency` seconds per scoring call before it scores (the service batches the ranks' concurrent
requests into one call, so that is about the latency one step's scoring adds, as a VLM judge's
would). For each latency, a run in series, then one with rl.async_reward = true, against the same service.

A step's time is the driver's: the sum of its `time/*` metrics (rollout, reward wait, train and
orchestration, which together are the driver's wall time of the step), the median over steps
2..N-1 (step 1 is warm-up, and with async_reward it makes two rollouts; the last step has no next
rollout to overlap). `ratio` = async / series.

    python bench/async_reward_bench.py [--latency 1 3] [--steps 5] [--out /tmp/async-bench]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "manifests" / "nft_t2i_smoke.toml"
PHASES = ("time/rollout_s", "time/reward_s", "time/train_s", "time/orchestration_s")


def slow_registry(latency_s: float) -> dict:
    """The built-in rewards, brightness sleeping `latency_s` per call first."""
    import attrs

    from cosmos_rl.rewards.registry import build_registry

    registry = build_registry()
    fast = registry["brightness"].fn

    def slow(pixels, prompts):
        time.sleep(latency_s)
        return fast(pixels, prompts)

    registry["brightness"] = attrs.evolve(registry["brightness"], fn=slow)
    return registry


def run(out: Path, name: str, url: str, steps: int, async_reward: bool) -> dict:
    from rich.console import Console

    from cosmos_rl.commands import launch
    from cosmos_rl.config import load

    overrides = [
        f'job.output_dir="{out}"', f'job.name="{name}"', "job.progress=false", "job.log_every=1", f"rl.max_steps={steps}",
        "checkpoint.every=0", "checkpoint.keep=1", "rl.sample_grid_every=0", "rl.sample_steps=6", "rl.timesteps_per_sample=2",
        f'rl.reward.url="{url}"', f"rl.async_reward={str(async_reward).lower()}",
    ]  # fmt: skip
    began = time.perf_counter()
    assert launch.train(load.load(SMOKE, overrides), SMOKE, Console(stderr=True)) == 0
    wall = time.perf_counter() - began
    return {**summarise(out / name), "run_wall_s": round(wall, 1)}


def summarise(run_dir: Path) -> dict:
    """The steady steps' times of a finished run (log_every = 1): steps 2..N-1, since step 1 is
    warm-up (and makes two rollouts with async_reward) and the last step has no next rollout to
    overlap with its scoring."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = rows[1:-1]
    step_s = [sum(r[k] for k in PHASES) for r in steady]
    return {
        "step_s": round(statistics.median(step_s), 3), "steps_s": [round(s, 3) for s in step_s],
        **{k.removeprefix("time/"): round(statistics.median(r[k] for r in steady), 3) for k in PHASES},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, nargs="+", default=[1.0, 3.0], help="seconds the reward sleeps per call")
    parser.add_argument("--steps", type=int, default=5, help="steps per run (>= 3; the first and the last are left out)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be >= 3: step 1 is warm-up and the last step has nothing to overlap")
    from cosmos_rl.rewards.server import RewardServer

    out = args.out or Path(tempfile.mkdtemp(prefix="async-reward-bench-"))
    result: dict = {"manifest": str(SMOKE.relative_to(REPO)), "steps": args.steps, "latencies": {}}
    for latency in args.latency:
        server = RewardServer("127.0.0.1", 0, revision="builtin-v1", registry=slow_registry(latency))
        url = server.start()
        try:
            sync = run(out, f"sync_{latency:g}s", url, args.steps, False)
            async_ = run(out, f"async_{latency:g}s", url, args.steps, True)
        finally:
            server.stop()
        result["latencies"][f"{latency:g}s"] = {
            "sync": sync, "async": async_, "ratio": round(async_["step_s"] / sync["step_s"], 3),
        }  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
