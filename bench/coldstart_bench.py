"""Where the NFT cold start goes: `python3 bench/coldstart_bench.py [--repeat 3] [--ranks 4]` prints JSON.

  imports          one fresh process importing what an NFT actor imports, stage by stage in the
                   order the stack pulls them (each stage's seconds on top of the ones before it,
                   wall and CPU; median of `--repeat` processes). CPU seconds move much less with
                   load on a shared machine than wall seconds. `python_s` is a bare interpreter's
                   start-up; `without_scipy` is the same imports with scipy hidden.
  concurrent       `--ranks` such processes started together: the wall time until the last is
                   done, beside `--ranks` x one process's import time over the machine's cores.
  actors           a real ActorGroup of `--ranks` RankWorker actors (the smoke manifest's NFT) on a fresh
                   local Ray cluster, each actor stamping the wall clock as it goes: Ray start,
                   actor processes up with the worker class imported, process group formed, and
                   the build (its own imports, then model + LoRA + FSDP2 + optimizer). Twice, side by side:
                   `cold` (every actor's process started for it, as before dist/warm_workers.py)
                   and `warm` (the head's prestarted workers with the stack imported). Each waits
                   `--settle` s after Ray is up before creating the actors, so that
                   `ready_after_creation_s` (the group's start + build: first actor created -> all
                   ready) is taken with Ray already running; `preloaded_before_creation` counts the
                   actors whose worker had finished its imports by then.
  smoke_run        `cosmos-rl train manifests/nft_t2i_smoke.toml` for `--steps` steps: the ready
                   time it prints and its step split (bench/nft_bench.py's rule: medians, step 1 left out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "nft_t2i_smoke.toml"
# Keep Ray on loopback and offline (set before anything imports ray).
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}

# What an NFT actor imports, grouped in the order the stack pulls it in. diffusers' model modules
# import peft (diffusers.hooks), which imports transformers, accelerate and scipy; so "peft" is
# timed before diffusers to show it on its own.
STAGES = (
    ("torch", ["torch"]),
    ("torch_fsdp", ["torch.distributed.fsdp"]),
    ("torch_dcp", ["torch.distributed.checkpoint"]),  # cosmos_rl.checkpoint imports it at module level
    ("ray", ["ray"]),
    ("peft_transformers", ["peft"]),
    ("diffusers", [
        "diffusers.models.transformers.transformer_cosmos3", "diffusers.models.autoencoders.autoencoder_kl_wan",
        "diffusers.schedulers.scheduling_unipc_multistep",
    ]),
    ("diffusers_pipeline_module", ["diffusers.pipelines.cosmos.pipeline_cosmos3_omni"]),
    ("cosmos_rl", [
        "cosmos_rl.trainers.ray_driver", "cosmos_rl.trainers.spmd_worker", "cosmos_rl.trainers.online",
        "cosmos_rl.trainers.nft", "cosmos_rl.trainers.first_frames", "cosmos_rl.trainers.online_policy", "cosmos_rl.config.algorithms", "cosmos_rl.models.generate",
        "cosmos_rl.models.sampler_settings", "cosmos_rl.models.setup", "cosmos_rl.models.lora", "cosmos_rl.models.packing",
        "cosmos_rl.models.sampling", "cosmos_rl.models.text", "cosmos_rl.models.vae", "cosmos_rl.rewards.client",
        "cosmos_rl.rewards.functions", "cosmos_rl.data.prompts", "cosmos_rl.data.images", "cosmos_rl.data.pixels",
        "cosmos_rl.core.media", "cosmos_rl.core.flow", "cosmos_rl.models.text_kv",
        "cosmos_rl.dist.world", "cosmos_rl.dist.fsdp", "cosmos_rl.dist.context_parallel", "cosmos_rl.evaluation.evaluator", "cosmos_rl.evaluation.grid",
    ]),
)  # fmt: skip
ALL_MODULES = [m for _, mods in STAGES for m in mods]

_CHAIN = """
import importlib, json, sys, time
if sys.argv[2] == "hide-scipy":
    sys.modules["scipy"] = None  # find_spec then says "not installed", as in an image without it
wall, cpu = {}, {}
t, c = time.perf_counter(), time.process_time()
for name, mods in json.loads(sys.argv[1]):
    for m in mods:
        importlib.import_module(m)
    now, cnow = time.perf_counter(), time.process_time()
    wall[name], cpu[name], t, c = now - t, cnow - c, now, cnow
print(json.dumps({"wall": wall, "cpu": cpu, "modules": len(sys.modules)}))
"""


def _env() -> dict:
    return {**os.environ, **ENV}


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd=ROOT, env=_env())


def _chain(mode: str) -> dict:
    return json.loads(_python(_CHAIN, json.dumps(STAGES), mode).stdout.strip().splitlines()[-1])


def imports(repeat: int) -> dict:
    """Stage split (wall and CPU seconds, medians), and the same imports with scipy hidden: nothing
    the project needs imports scipy, but transformers imports it whenever it is installed. The two
    kinds of process alternate so load drifts over both alike."""
    runs, hidden, starts = [], [], []
    for _ in range(repeat):
        runs.append(_chain("plain"))
        hidden.append(_chain("hide-scipy"))
        began = time.perf_counter()
        _python("pass")
        starts.append(time.perf_counter() - began)

    def medians(rows: list[dict], kind: str) -> dict:
        return {name: round(statistics.median(r[kind][name] for r in rows), 3) for name, _ in STAGES}

    wall, cpu = medians(runs, "wall"), medians(runs, "cpu")
    hidden_cpu = medians(hidden, "cpu")
    return {
        "python_s": round(statistics.median(starts), 3), "stages_s": wall, "total_s": round(sum(wall.values()), 3),
        "stages_cpu_s": cpu, "total_cpu_s": round(sum(cpu.values()), 3), "modules": runs[0]["modules"],
        "without_scipy": {"total_cpu_s": round(sum(hidden_cpu.values()), 3), "modules": hidden[0]["modules"],
                          "peft_transformers_cpu_s": hidden_cpu["peft_transformers"]},
        "repeat": repeat,
    }  # fmt: skip


def concurrent(ranks: int, one_process_s: float) -> dict:
    code = "import importlib, json, sys\nfor m in json.loads(sys.argv[1]): importlib.import_module(m)"
    began = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps(ALL_MODULES)], cwd=ROOT, env=_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(ranks)]  # fmt: skip
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise RuntimeError(f"an import process failed: exit codes {codes}")
    cores = os.cpu_count() or 1
    return {
        "processes": ranks, "wall_s": round(time.perf_counter() - began, 3), "cores": cores,
        # If the processes only competed with each other: their CPU seconds over the cores.
        "cpu_bound_estimate_s": round(ranks * one_process_s / min(cores, ranks), 3),
    }  # fmt: skip


BUILD_IMPORTS = (
    "cosmos_rl.models.setup", "cosmos_rl.models.lora", "cosmos_rl.models.packing", "cosmos_rl.models.text",
    "cosmos_rl.models.sampling", "cosmos_rl.models.vae", "cosmos_rl.rewards.client", "cosmos_rl.data.prompts",
)  # fmt: skip


def _timed_worker_class():
    """The Ray driver's RankWorker stamping the wall clock at each start-up stage (time.time: one clock for the host's
    processes). Made inside a function so Ray ships it by value; its base is imported by name."""
    import importlib

    import psutil

    from cosmos_rl.trainers.ray_driver import RankWorker

    class TimedNFTWorker(RankWorker):
        def __init__(self, *args):
            import sys

            self.marks = {"process_started": psutil.Process().create_time()}
            # Set by a warm worker's preload (cosmos_rl.dist.preload_stack), before this actor was placed on it.
            self.marks["preload_finished"] = getattr(sys.modules.get("cosmos_rl.dist.preload_stack"), "FINISHED_AT", None)
            self._mark("class_imported")  # the CPU clock so far: Ray's worker start-up and this class's imports
            super().__init__(*args)

        def _mark(self, name: str) -> None:
            self.marks[name] = time.time()
            self.marks[f"cpu:{name}"] = time.process_time()

        def setup_world(self, address):
            self._mark("world_start")
            super().setup_world(address)
            self._mark("world_done")

        def build(self, resume):
            self._mark("build_start")
            for name in BUILD_IMPORTS:
                importlib.import_module(name)
            self._mark("build_imports_done")
            step = super().build(resume)
            self._mark("build_done")
            return step

        def get_marks(self):
            return self.marks

    return TimedNFTWorker


def actors(ranks: int, settle_s: float) -> dict:
    """The cold and the warm actor group, one after the other in this process."""
    return {"settle_s": settle_s, "cold": _actor_group(ranks, False, settle_s), "warm": _actor_group(ranks, True, settle_s)}


def _actor_group(ranks: int, warm: bool, settle_s: float) -> dict:
    """A real actor group, timed from inside (run in this process: Ray starts here)."""
    os.environ.update(ENV)  # before Ray is imported
    import ray

    from cosmos_rl.config import load
    from cosmos_rl.dist.ray_group import ActorGroup

    worker = _timed_worker_class()
    out_dir = tempfile.mkdtemp(prefix="coldstart-")
    overrides = [f'job.output_dir="{out_dir}"', f"rl.group_size={ranks}", "job.progress=false"]
    config = load.load(SMOKE, overrides)
    context = {"reward_urls": {config.rl.reward.name: "http://127.0.0.1:9"}, "reward_tokens": {config.rl.reward.name: None}}
    group = ActorGroup(config.grid, ranks, worker, (config, str(Path(out_dir) / "run"), context), warm=warm)
    try:
        t0 = time.time()
        group.cluster.connect()
        t_ray = time.time()
        time.sleep(settle_s)
        t_create = time.time()  # start() reserves the placement (milliseconds), then creates the actors
        group.start()
        t_world = time.time()
        group.call_all("build", False)
        t_ready = time.time()
        marks = group.call_all("get_marks")
    finally:
        group.shutdown()
        if ray.is_initialized():  # the group shut down its own cluster; a leftover connection would join the next
            ray.shutdown()

    def median_since(key: str, base: str | float) -> float:
        return round(statistics.median(m[key] - (m[base] if isinstance(base, str) else base) for m in marks), 3)

    def cpu(key: str, base: str | None) -> float:
        return round(statistics.median(m[f"cpu:{key}"] - (m[f"cpu:{base}"] if base else 0.0) for m in marks), 3)

    return {
        "ranks": ranks, "warm": warm, "ready_after_creation_s": round(t_ready - t_create, 3),
        "ray_start_s": round(t_ray - t0, 3),
        "group_start_s": round(t_world - t_create, 3), "build_s": round(t_ready - t_world, 3),
        # psutil's start times rest on the boot time in whole seconds: a second's margin.
        "actor_processes_started_before_creation": sum(m["process_started"] < t_create - 1.0 for m in marks),
        "preloaded_before_creation": sum(bool(m["preload_finished"]) and m["preload_finished"] < t_create for m in marks),
        "per_actor_median_s": {
            "process_start_after_ray": median_since("process_started", t_ray),
            "ray_worker_and_class_import": median_since("class_imported", "process_started"),
            "process_group": median_since("world_done", "world_start"),
            "build_imports": median_since("build_imports_done", "build_start"),
            "build_model_lora_fsdp_optimizer": median_since("build_done", "build_imports_done"),
        },
        "per_actor_median_cpu_s": {
            "ray_worker_and_class_import": cpu("class_imported", None),
            "process_group": cpu("world_done", "world_start"),
            "build_imports": cpu("build_imports_done", "build_start"),
            "build_model_lora_fsdp_optimizer": cpu("build_done", "build_imports_done"),
        },
        "last_actor_class_imported_after_ray_s": round(max(m["class_imported"] for m in marks) - t_ray, 3),
    }  # fmt: skip


def _step_split(run_dir: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from nft_bench import _step_split as split

    return {k: round(v, 4) if isinstance(v, float) else v for k, v in split(run_dir).items()}


def smoke_run(steps: int) -> dict:
    out_dir = tempfile.mkdtemp(prefix="coldstart-run-")
    argv = [
        sys.executable, "-m", "cosmos_rl.cli", "train", str(SMOKE), f"rl.max_steps={steps}",
        f'job.output_dir="{out_dir}"', "job.progress=false", "checkpoint.every=0", "rl.sample_grid_every=0",
    ]  # fmt: skip
    began = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
    wall = time.perf_counter() - began
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"the smoke run failed ({proc.returncode}): {text[-1500:]}")
    ready = re.search(r"(\d+) actors ready in ([\d.]+) s", text)
    return {
        "steps": steps, "actors": int(ready.group(1)), "ready_s": float(ready.group(2)), "wall_s": round(wall, 2),
        "step_split_median_s": _step_split(Path(out_dir) / "nft_t2i_smoke"),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="steps of the smoke run (0: no smoke run)")
    parser.add_argument("--no-actors", action="store_true", help="leave out the actor groups")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds between Ray up and the actors' creation")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    result: dict = {"bench": "coldstart", "cores": os.cpu_count()}
    result["imports"] = imports(args.repeat)
    result["concurrent"] = concurrent(args.ranks, result["imports"]["total_cpu_s"])
    if not args.no_actors:
        result["actors"] = actors(args.ranks, args.settle)
    if args.steps:
        result["smoke_run"] = smoke_run(args.steps)
    one = result["imports"]["total_s"] + result["imports"]["python_s"]
    result["goal_ready_s"] = round(2 * one, 3)  # issues 16, 25: ready in at most 2x one process's imports
    result["load_average_1min"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
