"""The stock diffusers Cosmos3 pipeline, as the reference the model-layer tests compare against."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

from cosmos_rl.models.build import ModelParts, build_preset, flow_scheduler

# What rl.init_keys_to_skip_loading lists for a Cosmos3-Nano base (the shipped public manifests).
NANO_HEADS = ["audio_*", "action_*"]


def stock_pipeline(parts: ModelParts, shift: float = 1.0, transformer=None) -> Cosmos3OmniPipeline:
    pipe = Cosmos3OmniPipeline(
        transformer=transformer if transformer is not None else parts.transformer,
        text_tokenizer=parts.tokenizer,
        vae=parts.vae,
        scheduler=flow_scheduler(shift),
        enable_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock_velocity(
    pipe: Cosmos3OmniPipeline, x_t: torch.Tensor, timestep: float, ids: list[int], fps: float = 24.0
) -> torch.Tensor:
    """One transformer call for one sample exactly as the pipeline's denoising loop makes it.

    x_t: [1, C, T, h, w]; timestep in the pipeline's units (about 1000 * sigma); fps the pipeline's
    `fps` (its default 24). Returns [1, C, T, h, w].
    """
    latents = x_t
    text = pipe._prepare_text_segment(ids, device="cpu")
    vision = pipe._prepare_vision_segment(
        input_vision_tokens=latents,
        has_image_condition=False,
        mrope_offset=text["vision_start_temporal_offset"],
        vision_fps=fps,
        curr=text["und_len"],
        device="cpu",
    )
    predictions = pipe.transformer(
        input_ids=text["input_ids"],
        text_indexes=text["text_indexes"],
        position_ids=torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"]], dim=1),
        und_len=text["und_len"],
        sequence_length=text["und_len"] + vision["num_vision_tokens"],
        vision_tokens=[latents],
        vision_token_shapes=vision["vision_token_shapes"],
        vision_sequence_indexes=vision["vision_sequence_indexes"],
        vision_mse_loss_indexes=vision["vision_mse_loss_indexes"],
        vision_timesteps=torch.full((vision["num_noisy_vision_tokens"],), timestep),
        vision_noisy_frame_indexes=vision["vision_noisy_frame_indexes"],
        return_dict=False,
    )[0]
    return predictions[0]


def nano_folder(folder: Path, *, seed: int = 0, native_flow_schedule: bool = False, **scheduler_config) -> Path:
    """A Cosmos3-Nano-layout pipeline folder at tiny size, written by diffusers' save_pretrained:
    model_index.json, transformer/ with the sound and action heads (sound_gen, action_gen),
    vae/, text_tokenizer/, scheduler/ (flow UniPC with `scheduler_config` on top)."""
    parts = build_preset("tiny", seed=seed, with_extra_heads=True)
    assert parts.transformer.config.sound_gen and parts.transformer.config.action_gen
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, **scheduler_config)
    pipe = Cosmos3OmniPipeline(
        transformer=parts.transformer,
        text_tokenizer=parts.tokenizer,
        vae=parts.vae,
        scheduler=scheduler,
        enable_safety_checker=False,
        use_native_flow_schedule=native_flow_schedule,
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder


def folder_pipeline(folder: Path) -> Cosmos3OmniPipeline:
    """The stock pipeline exactly as diffusers loads it from `folder`."""
    pipe = Cosmos3OmniPipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe
