"""torchrun worker for tests/test_bf16_path.py: what the `model.dtype = "bfloat16"` path carries on
CPU, on 2 gloo ranks. Rank 0 writes what it saw to the JSON file named on the command line.

1. gloo's own bf16 all-gather and reduce-scatter (the collectives FSDP2 issues), on values that
   bf16 holds exactly.
2. The trainers' model (`models.setup.build_trainable` of the DPO smoke manifest in bfloat16:
   LoRA, FSDP2 mixed precision) with hooks recording the dtypes and values reaching the
   transformer's forward, its rotary embedding, its timestep projection and a decoder layer, for an
   image batch (trained one AdamW step: the reduced gradients' and the optimizer state's dtypes)
   and a 2-latent-frame clip at an fps other than the model's base_fps.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
# A Wan 2.1 VAE's temporal layout (Cosmos3-Nano's: 4 frames per latent frame); the tiny preset's
# VAE does not compress time, so its clips have no 2-latent-frame size that fps modulation spaces.
WAN_VAE_TIMING = {"dim_mult": [1, 2, 4, 4], "temperal_downsample": [False, True, True]}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def gloo_collectives() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = torch.full((3,), rank + 1.5, dtype=torch.bfloat16)
    gathered = torch.empty(3 * world, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(gathered, shard)
    full = torch.arange(4, dtype=torch.bfloat16) * (rank + 1)
    mine = torch.empty(4 // world, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(mine, full)
    scattered = torch.empty(4, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(scattered, mine)
    return {
        "world": world,
        "all_gather": gathered.tolist(), "all_gather_dtype": str(gathered.dtype),
        "reduce_scatter": scattered.tolist(), "reduce_scatter_dtype": str(mine.dtype),
    }  # fmt: skip


class Recorder:
    """Forward pre-hooks that note what each watched module receives, per call label."""

    def __init__(self, transformer: torch.nn.Module) -> None:
        self.label = ""
        self.seen: dict[str, dict] = {}
        transformer.register_forward_pre_hook(self._root, with_kwargs=True)
        transformer.rotary_emb.register_forward_pre_hook(self._rotary, with_kwargs=True)
        transformer.time_proj.register_forward_pre_hook(self._time_proj)
        transformer.time_embedder.register_forward_pre_hook(self._time_embedder)
        transformer.layers[0].register_forward_pre_hook(self._layer, with_kwargs=True)

    def _note(self, **values) -> None:
        self.seen.setdefault(self.label, {}).update(values)

    def _root(self, module, args, kwargs):
        timesteps, positions = kwargs["vision_timesteps"], kwargs["position_ids"]
        self._note(
            forward_timesteps_dtype=str(timesteps.dtype), forward_timesteps=timesteps.tolist(),
            forward_positions_dtype=str(positions.dtype), forward_positions=positions.tolist(),
            und_len=int(kwargs["und_len"]),
        )  # fmt: skip

    def _rotary(self, module, args, kwargs):
        positions = kwargs["position_ids"]
        self._note(rotary_positions_dtype=str(positions.dtype), rotary_positions=positions.tolist())

    def _time_proj(self, module, args):
        self._note(time_proj_input_dtype=str(args[0].dtype), time_proj_input=args[0].tolist())

    def _time_embedder(self, module, args):
        self._note(time_embedder_weight_dtype=str(next(module.parameters()).dtype))

    def _layer(self, module, args, kwargs):
        hidden = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.is_floating_point()]
        self._note(
            layer_weight_dtype=str(next(module.parameters()).dtype),
            layer_input_dtypes=sorted({str(a.dtype) for a in hidden}),
        )


def model_dtypes() -> dict:
    from cosmos_rl.config import load
    from cosmos_rl.core.media import MediaSpec, frame_timing
    from cosmos_rl.models.packing import velocity
    from cosmos_rl.models.setup import build_optimizer, build_trainable, optimizer_step
    from cosmos_rl.models.text import tokenize_prompts

    config = load.load(REPO / "manifests" / "dpo_t2i_smoke.toml", ['model.dtype="bfloat16"'])
    model = build_trainable(config, torch.device("cpu"))
    transformer = model.transformer
    recorder = Recorder(transformer)
    params = model.trainable_parameters()
    optimizer, schedule = build_optimizer(params, config.rl.optimizer)
    result: dict = {"master_dtypes_before": sorted({str(p.dtype) for p in params})}

    generator = torch.Generator().manual_seed(3)
    ids, _ = tokenize_prompts(model.tokenizer, ["a cube", "a red sphere on a table"])  # shorter first: no reordering
    result["prompt_lengths"] = [int(i.numel()) for i in ids]
    x_t = torch.randn(2, 4, 1, 4, 4, generator=generator)
    # First a no-grad reference forward, as a DPO step starts: FSDP2 plans its gradient dtypes at
    # the first forward, and must still reduce the policy's gradients in fp32 after it.
    recorder.label = "reference"
    with torch.no_grad(), model.reference() as reference:
        velocity(reference, x_t, torch.tensor([0.75, 0.25]), ids)
    recorder.label = "image"
    v = velocity(transformer, x_t, torch.tensor([0.75, 0.25]), ids)
    result["image_velocity_dtype"] = str(v.dtype)
    v.square().mean().backward()
    result["reduced_grad_dtypes"] = sorted({str(_local(p.grad).dtype) for p in params if p.grad is not None})
    result["params_with_grad"] = sum(p.grad is not None for p in params)
    result["trainable_params"] = len(params)
    optimizer_step(params, optimizer, schedule, config.rl.optimizer.grad_clip)
    moments = [_local(state[key]) for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    result["optimizer_state_dtypes"] = sorted({str(m.dtype) for m in moments})
    result["optimizer_states"] = len(optimizer.state)
    result["master_dtypes_after"] = sorted({str(p.dtype) for p in params})

    clip = MediaSpec(frames=5, height=32, width=32, fps=16.0)  # 5 frames at 4x: 2 latent frames
    timing = frame_timing(clip, WAN_VAE_TIMING)
    result["clip_timing"] = timing
    recorder.label = "video"
    with torch.no_grad():
        v = velocity(transformer, torch.randn(1, 4, 2, 4, 4, generator=generator), torch.tensor([0.5]), ids[1:], **timing)
    result["video_velocity_dtype"] = str(v.dtype)
    result["base_fps"] = float(transformer.config.base_fps)
    result["modality_margin"] = int(transformer.config.unified_3d_mrope_temporal_modality_margin)
    result["seen"] = recorder.seen
    return result


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    try:
        results = {"gloo": gloo_collectives(), "model": model_dtypes()}
        if dist.get_rank() == 0:
            Path(out_path).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
    # A normal interpreter exit after gloo work sometimes aborts (docs/topology.md, "Platform traps"); leave directly.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
