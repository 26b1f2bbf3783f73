"""The built-in presets' network configurations, as plain keyword dicts (torch-free).

The builders (`models.build`, `shapes.preset`) construct the diffusers classes from these, and
preflight and `plan` read them to answer size questions about a preset (latent cells, temporal
compression, tokens per sample, hidden size) without building a model.
"""

from __future__ import annotations

TINY_TRANSFORMER = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    latent_channel=4,
    latent_patch_size=2,
    patch_latent_dim=16,  # latent_channel * patch_size**2
    rope_axes_dim=[4, 2, 2],  # sums to head_dim / 2; a wrong sum is clipped silently
    dtype="float32",
)

# 32x32 RGB -> patchify 2 (12 channels) -> one 2x downsample -> 8x8 latents with 4 channels.
TINY_VAE = dict(
    base_dim=8,
    z_dim=4,
    dim_mult=[1, 1],
    num_res_blocks=1,
    attn_scales=[],
    temperal_downsample=[False],
    patch_size=2,
    in_channels=12,
    out_channels=12,
    # Deliberately not 0/1 so a missing (de)normalisation shows up in tests.
    latents_mean=[0.1, -0.2, 0.05, 0.0],
    latents_std=[0.9, 1.1, 1.2, 0.8],
    scale_factor_spatial=4,
    scale_factor_temporal=1,  # what the network does: no temporal_downsample stage is set
)

SHAPES_TRANSFORMER = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    latent_channel=4,
    latent_patch_size=2,
    patch_latent_dim=16,
    rope_axes_dim=[8, 4, 4],  # sums to head_dim / 2
    rope_theta=100.0,
    dtype="float32",
)

SHAPES_VAE = dict(
    base_dim=16,
    z_dim=4,
    dim_mult=[1, 1],
    num_res_blocks=1,
    attn_scales=[],
    temperal_downsample=[False],
    patch_size=2,
    in_channels=12,
    out_channels=12,
    latents_mean=[0.0] * 4,  # measured after the VAE is trained (shapes.preset.set_latent_stats)
    latents_std=[1.0] * 4,
    scale_factor_spatial=4,
    scale_factor_temporal=1,  # what the network does: no temporal_downsample stage is set
)

# The video base: the image base's networks with its VAE's one downsampling stage made temporal,
# so the VAE halves time as well as quartering space: 9 frames of 32x32 are 5 latent frames of 8x8
# cells (the first alone, then two per four frames), 80 vision tokens at patch 2. It starts from
# the image base's weights, all of them but the new stage's `time_conv`s: a causal Wan VAE passes
# the first frame around those, so at the start frame 0 round-trips as an image does. Measured
# against two temporal stages (4x in time, unpatched, 4 or 16 latent channels) in
# docs/studies/2026-12-03-video-base-build.md: that one rounds every shape to a blob the verifier cannot name.
SHAPES_VIDEO_TRANSFORMER = SHAPES_TRANSFORMER
SHAPES_VIDEO_VAE = dict(
    SHAPES_VAE,
    temperal_downsample=[True],
    scale_factor_temporal=2,
)

# The Push-T world-model base (`commands.pusht_base_build`, docs/world.md "The Push-T base"): the
# video base's transformer at latent patch 4 (4 x 4 cells a token: 144 vision tokens a 9-frame clip
# at 32 x 32, where patch 2 makes 576; a forward-dynamics SFT step 3.0x faster) with action heads:
# 2 action columns (Push-T's width) and Cosmos3-Nano's 21 embodiment domains (`pusht` is domain 4).
# Its VAE is the video VAE in the fine layout: no temporal stage and one spatial stage (patchify 2
# only), so a latent frame a frame and 16 x 16 cells a 32 x 32 frame: no latent averages two frames'
# (or a 2 x 2 block's) agent positions (docs/studies/2026-12-07-pusht-vae.md, `--layout fine`).
PUSHT_PATCH = 4
PUSHT_TRANSFORMER = dict(
    SHAPES_VIDEO_TRANSFORMER,
    latent_patch_size=PUSHT_PATCH,
    patch_latent_dim=SHAPES_VIDEO_TRANSFORMER["latent_channel"] * PUSHT_PATCH * PUSHT_PATCH,
    action_gen=True,
    action_dim=2,
    num_embodiment_domains=21,
)
PUSHT_VAE = dict(
    SHAPES_VIDEO_VAE,
    dim_mult=[1],
    temperal_downsample=[],
    scale_factor_spatial=2,
    scale_factor_temporal=1,
)

# name -> (transformer config, VAE config); vocab_size comes from the tokenizer at build time.
PRESET_ARCHITECTURES: dict[str, tuple[dict, dict]] = {
    "tiny": (TINY_TRANSFORMER, TINY_VAE),
    "shapes": (SHAPES_TRANSFORMER, SHAPES_VAE),
    "shapes_video": (SHAPES_VIDEO_TRANSFORMER, SHAPES_VIDEO_VAE),
    "pusht": (PUSHT_TRANSFORMER, PUSHT_VAE),
}

# What a preset makes when nothing says otherwise (`cosmos-rl eval preset:NAME`): (frames, side).
PRESET_MEDIA: dict[str, tuple[int, int]] = {"tiny": (1, 32), "shapes": (1, 32), "shapes_video": (9, 32), "pusht": (9, 32)}
