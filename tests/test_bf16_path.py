"""The `model.dtype = "bfloat16"` path on CPU (docs/scale.md, "Precision"): gloo carries FSDP2's bf16
collectives, and what reaches the transformer's forward under mixed precision keeps the pipeline's
values: integer timesteps, float32 mRoPE positions (never bf16, whose spacing past the 15000
modality margin is 64), bf16 only inside the layers; gradients, optimizer state and master
weights stay float32. One 2-rank torchrun of tests/_bf16_worker.py; expected values by hand."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MARGIN = 15000  # the tiny preset's unified_3d_mrope_temporal_modality_margin, as Cosmos3-Nano's
TOKENS = 4  # a 32x32 image: 4x4 latent cells in 2x2 patches


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16") / "results.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONWARNINGS": "ignore::UserWarning,ignore::FutureWarning",
    }  # fmt: skip
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={_free_loopback_port()}",
        str(REPO / "tests" / "_bf16_worker.py"), str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_gloo_carries_bf16_all_gather_and_reduce_scatter(seen):
    gloo = seen["gloo"]
    assert gloo["world"] == 2
    # rank r sends [r + 1.5] * 3; every rank receives both, in rank order
    assert gloo["all_gather"] == [1.5] * 3 + [2.5] * 3 and gloo["all_gather_dtype"] == "torch.bfloat16"
    # rank r sends (r + 1) * [0, 1, 2, 3]: the sum is [0, 3, 6, 9], rank 0 keeps [0, 3], rank 1 [6, 9]
    assert gloo["reduce_scatter"] == [0.0, 3.0, 6.0, 9.0] and gloo["reduce_scatter_dtype"] == "torch.bfloat16"


def _positions(text_lengths: list[int], frames: int, frame_step: float) -> list[list[float]]:
    """[3, N] mRoPE positions by hand: each prompt's text at 0..L-1 on all three axes, then each
    sample's vision tokens at time L + margin + k * frame_step for latent frame k, and its 2x2 patch
    grid's row and column (spatial ids restart at 0)."""
    time, rows, cols = [], [], []
    for length in text_lengths:
        time += list(range(length))
    rows, cols = list(time), list(time)
    for length in text_lengths:
        for k in range(frames):
            time += [length + MARGIN + k * frame_step] * TOKENS
            rows += [0, 0, 1, 1]
            cols += [0, 1, 0, 1]
    return [[float(v) for v in axis] for axis in (time, rows, cols)]


def test_the_image_forward_gets_integer_timesteps_and_float32_positions(seen):
    model = seen["model"]
    image = model["seen"]["image"]
    short, long = model["prompt_lengths"]
    assert image["und_len"] == short + long
    # flow times 0.75 and 0.25 -> the pipeline's integers floor(1000 t), one per vision token; bf16 would give 752
    assert image["forward_timesteps_dtype"] == "torch.int64"
    assert image["forward_timesteps"] == [750] * TOKENS + [250] * TOKENS
    assert image["time_proj_input_dtype"] == "torch.float32"  # timesteps * timestep_scale
    assert image["time_proj_input"] == pytest.approx([0.75] * TOKENS + [0.25] * TOKENS, abs=1e-6)
    expected = _positions([short, long], frames=1, frame_step=0.0)
    assert image["forward_positions_dtype"] == image["rotary_positions_dtype"] == "torch.float32"
    assert image["forward_positions"] == expected
    assert [axis[0] for axis in image["rotary_positions"]] == expected  # [3, 1, N] at the rotary embedding


def test_a_two_latent_frame_clip_off_base_fps_keeps_its_fractional_time_positions(seen):
    model = seen["model"]
    video = model["seen"]["video"]
    assert model["base_fps"] == 24.0 and model["clip_timing"] == {"fps": 16.0, "temporal_factor": 4}
    # 4 frames per latent frame at 16 fps vs the base's 24: latent frame k sits at k * 24 / 16 = 1.5 k
    length = model["prompt_lengths"][1]
    expected = _positions([length], frames=2, frame_step=1.5)
    assert expected[0][-1] == length + MARGIN + 1.5
    assert torch.tensor(expected[0][-1]).bfloat16().item() != expected[0][-1]  # what bf16 would lose
    assert video["forward_positions_dtype"] == video["rotary_positions_dtype"] == "torch.float32"
    assert video["forward_positions"] == expected
    assert [axis[0] for axis in video["rotary_positions"]] == expected
    assert video["forward_timesteps_dtype"] == "torch.int64" and video["forward_timesteps"] == [500] * 2 * TOKENS
    assert model["video_velocity_dtype"] == "torch.float32"


def test_layers_compute_in_bf16_while_gradients_optimizer_state_and_master_weights_stay_float32(seen):
    model = seen["model"]
    for label in ("reference", "image", "video"):
        call = model["seen"][label]
        # mixed precision is live: the gathered weights and the layers' inputs are bf16
        assert call["layer_weight_dtype"] == call["time_embedder_weight_dtype"] == "torch.bfloat16", label
        assert call["layer_input_dtypes"] == ["torch.bfloat16"], label
    assert model["image_velocity_dtype"] == "torch.float32"  # cast back to the latents' dtype
    assert model["trainable_params"] > 0 and model["params_with_grad"] == model["trainable_params"]
    # reduce-scattered in fp32 (reduce_dtype), though the first forward was the no-grad reference
    assert model["reduced_grad_dtypes"] == ["torch.float32"]
    assert model["optimizer_states"] == model["trainable_params"]
    assert model["optimizer_state_dtypes"] == ["torch.float32"]
    assert model["master_dtypes_before"] == model["master_dtypes_after"] == ["torch.float32"]
