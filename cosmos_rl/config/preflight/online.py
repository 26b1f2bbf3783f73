"""Every online algorithm's rules (NFT, GRPO, and any entry made by `algorithms.online`): one
colocated Ray actor group, one sample per rank, a base checkpoint, pinned reward services, the
old/ref policies and the sampler (nft.md section 4). `nft.py` and `grpo.py` start from these.
"""

from __future__ import annotations

from cosmos_rl.config.preflight.rewards import reward_rules
from cosmos_rl.config.preflight.rules import Rules, algorithm_name
from cosmos_rl.core import schema


# Caps on the online counts, checked before anything plans or starts (a count of 2^63 - 1 planned a
# world of 9.2e18 ranks). group_size is the world: one rank per sample. 16384 ranks is 2048 nodes of
# 8 GPUs, past the largest cluster a job is placed on. A step samples prompts_per_step prompts one
# after another on that group: 65536 of them is days of sampling for one optimizer step. The flow
# sampler converges in tens of steps (rollouts use 10 to 50): `cosmos-rl eval --sample-steps` caps
# at the same 1000.
GROUP_SIZE_MAX = 16384
PROMPTS_PER_STEP_MAX = 65536
SAMPLE_STEPS_MAX = 1000


def _capped(r: Rules, key: str, value: int, cap: int, why: str) -> None:
    if value > cap:
        r.error(key, f"at most {cap}: {why}", value, f"use {cap} or less")


def online_ranks(c: schema.RunConfig) -> int:
    """The model ranks of an online run: one per sample of a group, or one context group of
    grid.context_parallel ranks per sample (a value below 1 is refused on its own key)."""
    return c.rl.group_size * max(c.grid.context_parallel, 1)


def _ranks_are(c: schema.RunConfig) -> str:
    # How the rank count follows from the manifest, for the messages below.
    cp = c.grid.context_parallel
    return f"rl.group_size ({c.rl.group_size})" if cp <= 1 else f"rl.group_size x grid.context_parallel ({c.rl.group_size} x {cp} = {online_ranks(c)})"


def nft_shapes(c: schema.RunConfig) -> tuple[dict[str, list[int]] | None, list[tuple[str, str, object, str]]]:
    """Role shapes of an online run (NFT's topology), from grid.shapes when given, else grid.num_replicas/grid.ranks."""
    rl, g, name = c.rl, c.grid, algorithm_name(c.rl)
    world = online_ranks(c)
    want = [1, world]
    bad: list[tuple[str, str, object, str]] = []
    if g.shapes is not None:
        if g.num_replicas is not None or g.ranks is not None:
            bad.append(("grid.shapes", "given together with grid.num_replicas/grid.ranks", g.shapes, "set either grid.shapes or grid.num_replicas/grid.ranks, not both"))
        if set(g.shapes) != {"policy", "rollout"}:
            bad.append(("grid.shapes", "must name exactly the roles policy and rollout", sorted(g.shapes), f"write {{policy = {want}, rollout = {want}}}"))
        for role in ("policy", "rollout"):
            if role in g.shapes and g.shapes[role] != want:
                bad.append((f"grid.shapes.{role}", f"{name} needs (1, {'group_size' if c.grid.context_parallel <= 1 else 'group_size x context_parallel'}) = {tuple(want)}", g.shapes[role], f"set grid.shapes.{role} = {want}"))
        return (None if bad else {"policy": want, "rollout": want}), bad
    replicas = 1 if g.num_replicas is None else g.num_replicas
    ranks = world if g.ranks is None else g.ranks
    if replicas != 1:
        bad.append(("grid.num_replicas", f"{name} runs one execution replica", g.num_replicas, "set grid.num_replicas = 1 or remove it"))
    if ranks != world:
        bad.append(("grid.ranks", f"must equal {_ranks_are(c)}: one sample per model rank (or context group)", g.ranks, f"set grid.ranks = {world} or remove it"))
    return (None if bad else {"policy": [replicas, ranks], "rollout": [replicas, ranks]}), bad


def online_rules(c: schema.RunConfig, rl: schema.OnlineRLBase, r: Rules) -> None:
    """Every online algorithm's rules (nft.md section 4 and its reward, old/ref and sampler rules):
    one colocated Ray actor group, one sample per rank, a base checkpoint, pinned reward services."""
    g, name = c.grid, algorithm_name(rl)
    if g.backend != "ray":
        r.error("grid.backend", f"{name}'s five roles are one Ray actor group", g.backend, 'set grid.backend = "ray"')
    if g.grouping != "single":
        r.error("grid.grouping", f"{name} shares one process per rank among all roles", g.grouping, 'set grid.grouping = "single"')
    if g.gpu_placement != "colocated":
        r.error("grid.gpu_placement", f"{name}'s actors form one colocated FSDP world", g.gpu_placement, 'set grid.gpu_placement = "colocated"')
    if g.gpus_per_role is not None:
        r.error("grid.gpus_per_role", f"colocated {name} takes no per-role GPU overrides", g.gpus_per_role, "remove grid.gpus_per_role")
    r.at_least("rl.group_size", rl.group_size, 2, "set rl.group_size to 2 or more (advantages compare samples within a group)")
    _capped(r, "rl.group_size", rl.group_size, GROUP_SIZE_MAX, f"one rank per sample, and {GROUP_SIZE_MAX} ranks (2048 nodes x 8 GPUs) is past any cluster a run is placed on")
    for path, problem, got, fix in nft_shapes(c)[1]:
        r.error(path, problem, got, fix)
    # A count below 1 is already refused above; a product of it would suggest a negative fix.
    world = online_ranks(c)
    if g.device == "cuda" and g.nodes >= 1 and g.gpus_per_node >= 1 and g.nodes * g.gpus_per_node != world:
        r.error("grid.gpus_per_node", f"{name} puts one rank on each GPU, so grid.nodes * grid.gpus_per_node must equal {_ranks_are(c)}",
                g.gpus_per_node, f"use {g.nodes} node(s) x {world / g.nodes:g} GPUs, or change rl.group_size")
    if g.nodes > 1 and not rl.reward.url and not rl.rewards:
        r.error("rl.reward.url", "the built-in reward service listens on 127.0.0.1 of the driver's node, which other nodes cannot reach", "",
                "run `cosmos-rl reward serve --host 0.0.0.0 --token-env REWARD_TOKEN` (or your own service) where every node can reach it and set rl.reward.url")
    dp = c.model.config.parallelism.data_parallel_shard_degree
    if dp not in (1, world):
        r.error("model.config.parallelism.data_parallel_shard_degree", f"{name} shards over all {world} ranks ({_ranks_are(c)})", dp, f"remove it (derived) or set it to {world}")
    if not rl.init_from:
        r.error("rl.init_from", f"required: {name} always starts from a base checkpoint", "", "set rl.init_from to a diffusers folder, DCP folder or s3:// URL")
    reward_rules(c, rl, r)
    if rl.old.build_old and c.model.lora.rank == 0:
        r.error("model.lora.rank", f"{name} keeps the moving old policy as a second LoRA adapter, so it needs LoRA", 0,
                "set model.lora.rank > 0 (or rl.old.build_old = false)")
    if rl.old.build_old and rl.old.update_every < 1:
        r.error("rl.old.update_every", "must be >= 1 when rl.old.build_old is on", rl.old.update_every, "set rl.old.update_every = 1 or more")
    if not 0 <= rl.old.decay_rate:
        r.error("rl.old.decay_rate", "must be >= 0", rl.old.decay_rate, "use e.g. 0.001")
    r.at_least("rl.old.flat_steps", rl.old.flat_steps, 0, "use 0 (no flat start) or e.g. 75 (DiffusionNFT's OCR recipe)")
    if not 0 <= rl.old.decay_cap < 1:
        r.error("rl.old.decay_cap", "must be in [0, 1)", rl.old.decay_cap, "use e.g. 0.5")
    if rl.ref.update_every != 0:
        r.error("rl.ref.update_every", "the reference is frozen", rl.ref.update_every, "set rl.ref.update_every = 0")
    r.at_least("rl.sample_steps", rl.sample_steps, 2)
    _capped(r, "rl.sample_steps", rl.sample_steps, SAMPLE_STEPS_MAX, "the flow sampler converges in tens of steps (rollouts use 10 to 50), as eval --sample-steps caps")
    if rl.sampler_shift is not None:
        r.positive("rl.sampler_shift", rl.sampler_shift)
    r.at_least("rl.guidance", rl.guidance, 0)
    r.at_least("rl.prompts_per_step", rl.prompts_per_step, 1)
    _capped(r, "rl.prompts_per_step", rl.prompts_per_step, PROMPTS_PER_STEP_MAX,
            f"a step samples its prompts one after another on the group; {PROMPTS_PER_STEP_MAX} is days of sampling per optimizer step")  # fmt: skip
    r.at_least("rl.sample_grid_every", rl.sample_grid_every, 0)
    if rl.async_reward and isinstance(rl, schema.GRPOConfig):
        # GRPO's rollout keeps its SDE step records (x, x_next, the sampling log-probs) for learn of the
        # same step; a rollout made one step early would replace them, and no checkpoint holds them.
        r.error("rl.async_reward", "GRPO's rollout keeps its SDE steps' log-probs for the step that made it, which one-step-off scoring "
                "would overwrite before learn and no checkpoint holds", True, "set rl.async_reward = false (one-step-off scoring is NFT's)")
    if rl.prompts.file:
        r.local_path("rl.prompts.file", rl.prompts.file, kind="file")


def batch_std_rule(rl: "schema.NFTConfig | schema.GRPOConfig", r: Rules) -> None:
    """`batch` normalises by one std over the step's rewards; with one prompt a step those rewards
    are one prompt's group (NFT and GRPO)."""
    if rl.advantage_std_scope == "batch" and rl.prompts_per_step == 1:
        r.warn("rl.advantage_std_scope", "is \"batch\" with rl.prompts_per_step = 1: a step's batch is one prompt's group, so this is the group std "
               "(every non-constant group scaled to unit advantages, however little its rewards differ)", rl.advantage_std_scope,
               'raise rl.prompts_per_step so the batch spans several groups, or set rl.advantage_std_scope = "group" to say what runs')
