"""NFT's rules (docs/nft.md): the online rules (`online.py`), then modality and profile, the
first frame (`condition.py`), the sampler type and the objective's knobs. The registry names
`nft_rules` (config/algorithms.py)."""

from __future__ import annotations

from cosmos_rl.config.preflight.media import frame_size
from cosmos_rl.config.preflight.online import batch_std_rule, online_rules
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema
from cosmos_rl.core.problems import show


def nft_rules(c: schema.RunConfig, rl: schema.NFTConfig, r: Rules) -> None:
    """NFT's rules (nft.md): the online rules, then modality/profile, the sampler type and the objective's knobs."""
    online_rules(c, rl, r)
    modality_rule(rl, c.model, r)
    if rl.modality == "video" and c.model.num_frames > 1:
        # The spec's video contract: frames and size come from [model] alone, and the model is built
        # with every head its checkpoint has (a Nano folder's sound and action heads, unused).
        if rl.profile:
            r.error("rl.profile", "video NFT takes no profile (a profile fixes T2I production coordinates; a clip's frames and size come from [model])",
                    rl.profile, "remove rl.profile (set model.num_frames and model.image_size instead)")
        if rl.init_keys_to_skip_loading:
            r.error("rl.init_keys_to_skip_loading", "must be empty for video NFT: the video model is built with every head of its checkpoint (sound and action heads present, unused)",
                    rl.init_keys_to_skip_loading, "remove rl.init_keys_to_skip_loading")
    elif rl.modality == "image":
        known = ", ".join(show(p) for p in schema.T2I_PROFILES)
        if rl.profile not in schema.T2I_PROFILES:
            r.error("rl.profile", "image NFT needs a known T2I profile", rl.profile, f"use one of {known}")
        elif frame_size(c.model) != (schema.T2I_PROFILES[rl.profile]["image_size"],) * 2:
            size = schema.T2I_PROFILES[rl.profile]["image_size"]
            key, got = ("model.image_size", c.model.image_size) if c.model.image_size is not None else ("model.height", [c.model.height, c.model.width])
            r.error(key, f"profile {show(rl.profile)} fixes the image size at {size}", got, f"set model.image_size = {size}")
    if rl.scheduler != "unipc":
        r.error("rl.scheduler", "only the UniPC sampler is supported", rl.scheduler, 'set rl.scheduler = "unipc"')
    if not rl.advantage_low < rl.advantage_high:
        r.error("rl.advantage_low", f"must be below rl.advantage_high ({rl.advantage_high})", rl.advantage_low, "e.g. -5.0 and 5.0")
    elif rl.r_map == "linear" and rl.linear_map == "per_side" and not rl.advantage_low < 0 < rl.advantage_high:
        # Each side of A = 0 is mapped on its own, so the clamp needs room on both sides of 0.
        key, got = ("rl.advantage_low", rl.advantage_low) if rl.advantage_low >= 0 else ("rl.advantage_high", rl.advantage_high)
        r.error(key, 'with rl.linear_map = "per_side" (A = 0 maps to r = 0.5) the clamp must hold 0: advantage_low < 0 < advantage_high',
                got, 'e.g. advantage_low = -5.0 and advantage_high = 5.0, or rl.linear_map = "span"')
    if rl.guidance != 1:
        r.warn("rl.guidance", "NFT rollouts are guided while its training forwards are conditional only: DiffusionNFT samples CFG-free because its "
               "implicit-policy argument assumes the samples come from v_old's own distribution (docs/nft.md, \"The knobs that matter\")", rl.guidance,
               "set rl.guidance = 1.0 (CFG-free rollouts, as the official release trains)")
    batch_std_rule(rl, r)
    r.positive("rl.r_tau", rl.r_tau)
    r.positive("rl.beta", rl.beta)
    r.at_least("rl.kl_beta", rl.kl_beta, 0)
    r.positive("rl.policy_loss_scale", rl.policy_loss_scale)
    if not 0 <= rl.timesteps_per_sample <= rl.sample_steps:
        r.error("rl.timesteps_per_sample", f"must be in [0, rl.sample_steps = {rl.sample_steps}]", rl.timesteps_per_sample, "0 trains on all but one of the sampler's timesteps, the one left out drawn at random")


def modality_rule(rl: schema.NFTConfig, m: schema.ModelConfig, r: Rules) -> None:
    """rl.modality names what model.num_frames makes; it never sets frames or size."""
    made = "video" if m.num_frames > 1 else "image"
    if rl.modality != made:
        fix = ('set rl.modality = "image"' if made == "image" else 'set rl.modality = "video"') + \
            (" (or model.num_frames to 4k + 1 > 1 for video)" if made == "image" else " (or model.num_frames = 1 for images)")
        r.error("rl.modality", f"model.num_frames = {m.num_frames} makes {made}", rl.modality, fix)
