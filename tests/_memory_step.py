"""Two training steps of a Cosmos3 transformer per spec, for tests/test_memory_plan.py: prints, as
one JSON list, each spec's peak RSS growth in bytes (ru_maxrss after the steps minus ru_maxrss
before the model is built).

argv[1]: JSON list of {"transformer": config kwargs, "latent": [B, C, T, h, w], "lora_rank": r,
"checkpointing": bool}. Each spec runs in its own fork of this process, taken after the imports, so
its ru_maxrss starts at this process's RSS and no other spec's allocations count. Run it with
MALLOC_MMAP_THRESHOLD_ set (the test does): glibc then maps every large block and returns it when
freed, so RSS follows the live tensors instead of the heap's high-water mark."""

from __future__ import annotations

import json
import os
import resource
import sys

import torch
from diffusers import Cosmos3OmniTransformer

from cosmos_rl.models import lora
from cosmos_rl.models.packing import velocity


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def step_growth(spec: dict) -> int:
    torch.manual_seed(0)
    x_t, target = torch.randn(spec["latent"]), torch.randn(spec["latent"])
    before = _peak()
    transformer = Cosmos3OmniTransformer(**spec["transformer"])
    if spec["lora_rank"]:
        lora.add_adapters(transformer, spec["lora_rank"], 2.0 * spec["lora_rank"], ["policy"])
    else:
        transformer.lm_head.requires_grad_(False)  # as models.setup: no image loss reaches it
    if spec["checkpointing"]:
        transformer.enable_gradient_checkpointing()
    transformer.train()
    optimizer = torch.optim.AdamW([p for p in transformer.parameters() if p.requires_grad], lr=1e-4)
    batch = spec["latent"][0]
    ids = [torch.arange(1, 3) for _ in range(batch)]  # two text tokens: the vision tokens dominate
    for _ in range(2):  # the second step runs with the AdamW state the first one created
        v = velocity(transformer, x_t, torch.full((batch,), 0.5), ids)
        torch.nn.functional.mse_loss(v, target).backward()
        del v
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return _peak() - before


def main() -> None:
    torch.set_num_threads(1)  # before any fork: no OpenMP pool is shared across the forks
    specs = json.loads(sys.argv[1])
    children = []
    for spec in specs:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.write(write, str(step_growth(spec)).encode())
            os._exit(0)
        os.close(write)
        children.append((pid, read))
    growth = []
    for pid, read in children:
        with os.fdopen(read) as pipe:
            text = pipe.read()
        _, status = os.waitpid(pid, 0)
        if status or not text:
            raise SystemExit(f"a measuring fork failed (status {status})")
        growth.append(int(text))
    print(json.dumps(growth))


if __name__ == "__main__":
    main()
