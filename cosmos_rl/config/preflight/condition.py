"""Preflight rules of `[model.condition]` (core/condition.py, docs/video.md); torch-free.

What the rules can tell from the manifest alone: that the kind is known and the run makes clips
that leave frames to generate, that the algorithm takes a condition from that source (its
registry entry's `conditioned_from`), that an online run's prompt source can give every row its
frames, and that a reward judging the given frame is paired with a run conditioned on it. The
frames themselves (present, decodable, the clip's size) are `validate --data`'s and the run's.
"""

from __future__ import annotations

import math
from pathlib import Path

from cosmos_rl.config import algorithms
from cosmos_rl.config.preflight.rewards import owner
from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema
from cosmos_rl.checkpoint.weight_files import FolderProblem, read_config
from cosmos_rl.core.actions import ACTION_MODES, EMBODIMENT_DOMAIN_IDS, EMBODIMENT_WIDTHS, VIEW_POINTS
from cosmos_rl.core.condition import FILE_SOURCES, UnknownCondition, kind_named
from cosmos_rl.models.architectures import PRESET_ARCHITECTURES
from cosmos_rl.suites import registry as suites



def _reward_names(rl) -> list[tuple[str, str]]:
    """(key, name) of each reward an online run scores with, as rewards.multi.reward_terms lists them."""
    if not isinstance(rl, schema.OnlineRLBase):
        return []
    if rl.rewards:
        return [(f"rl.rewards[{i}].name", t.name) for i, t in enumerate(rl.rewards)]
    return [("rl.reward.name", rl.reward.name)]


def condition_rules(c: schema.RunConfig, r: Rules) -> None:
    table, entry = c.model.condition, algorithms.of(c)
    for key, name in _reward_names(c.rl):
        suite = owner(name)  # a reward judging frame 0 against its suite's given first frame
        if suite is None or not suite.reward(name).given_frame or table.source == suite.name:
            continue
        part = suite.reward(name).part
        plain = next((x.name for x in suite.rewards if x.part == part and not x.given_frame), None)
        r.error(key, f"judges frame 0 against the {suite.title} world's first frame of the caption, and this run's rollouts "
                f"are not conditioned on it (model.condition.source = {table.source!r})", name,
                f'set [model.condition] kind = "first_frame", source = "{suite.name}"' + (f", or use {plain!r}" if plain else ""))  # fmt: skip
    for key, name in _reward_names(c.rl):
        suite = owner(name)  # an episode suite's reward judges a rollout against the window its key names
        if suite is None or not suite.is_episodic:
            continue
        if suite.reward(name).actions and (table.source != suite.name or table.kind != "policy"):  # it executes the generated rows
            r.error(key, f"executes each rollout's generated action rows in the {suite.title} simulator from the window its prompt's key "
                    f"names, and this run's rollouts generate no actions there (model.condition kind {table.kind!r}, source {table.source!r})",
                    name, f'set [model.condition] kind = "policy", source = "{suite.name}", with its window keys as rl.prompts.file')
        elif not suite.reward(name).actions and (table.source != suite.name or table.kind != "forward_dynamics"):
            r.error(key, f"judges each clip against the {suite.title} window its prompt's key names, and this run's rollouts are "
                    f"not that world's forward dynamics (model.condition kind {table.kind!r}, source {table.source!r})", name,
                    f'set [model.condition] kind = "forward_dynamics", source = "{suite.name}", with its window keys as rl.prompts.file')
    try:
        kind = kind_named(table.kind)
    except UnknownCondition as exc:
        r.error("model.condition.kind", f"unknown condition: {exc}", table.kind, 'use "none", "first_frame" or an action mode ("forward_dynamics", "policy", "inverse_dynamics")')
        return
    action_rules(c, kind, r)
    if not 0 <= table.probability <= 1:
        r.error("model.condition.probability", "must be in [0, 1]", table.probability, "use e.g. 0.5 (half the clips train image-to-video)")
    if not kind.given_frames:
        if table.source != "none":
            r.error("model.condition.source", "names where given frames come from, and model.condition.kind gives none", table.source,
                    'remove model.condition.source, or set model.condition.kind = "first_frame"')
        if table.probability != 1.0:
            r.error("model.condition.probability", "is the share of conditioned samples, and model.condition.kind gives no frames",
                    table.probability, "remove model.condition.probability")
        return
    frames = c.model.num_frames
    if frames == 1:
        r.error("model.condition.kind", "conditions a clip's leading frames, and this run makes images", table.kind,
                'remove [model.condition], or make video: model.num_frames = 4k + 1 above 1 (rl.modality = "video" for NFT)')
        return
    if kind.given_frames >= frames and not kind.every_frame:
        r.error("model.condition.kind", f"gives {kind.given_frames} frames, nothing left to generate of {frames}", table.kind,
                f"raise model.num_frames above {kind.given_frames}")
    taken = entry.conditioned_from
    if taken == "pairs":  # DPO: forward dynamics on pairs of window keys only (action_rules); nothing else
        if not kind.action_mode:
            r.error("model.condition.kind", f'rl.algorithm = "{entry.name}" takes no condition in this release other than forward_dynamics '
                    "on pairs of an episode suite's window keys", table.kind,
                    'remove [model.condition]; image-to-video trains with nft, grpo or sft')
        return
    if not taken:
        r.error("model.condition.kind", f'rl.algorithm = "{entry.name}" takes no condition in this release', table.kind,
                "remove [model.condition]; image-to-video trains with nft, grpo or sft")
        return
    if taken == "data":
        if table.source != "data":
            r.error("model.condition.source", f"{entry.title} conditions each training clip on its own leading frames", table.source,
                    'set model.condition.source = "data"')
        # An action mode's windows are also the world model's VAE data (rl.train = "vae" reads the
        # windows' frames; the actions ride along unused): only first-frame conditioning is refused.
        if isinstance(c.rl, schema.SFTConfig) and c.rl.train != "transformer" and not kind.action_mode:
            r.error("model.condition.kind", "conditions a clip's first frame, and this run trains no clips through the transformer",
                    table.kind, 'remove [model.condition], or train rl.train = "transformer"')
        return
    # taken == "rollout": every rollout is given its frames from a prompt row's image or a suite.
    if table.probability != 1.0:
        r.error("model.condition.probability", "an online run conditions every rollout", table.probability, "remove it (1)")
    prompts = c.rl.prompts.file
    if table.source == "data":
        r.error("model.condition.source", "is a training clip's own frames, and an online run generates its clips",
                table.source, 'use "image" (each prompt row\'s image) or a suite, e.g. "shapes_video"')
    elif table.source == "image" and Path(prompts).suffix.lower() != ".jsonl":
        r.error("model.condition.source", 'takes each prompt row\'s "image", so it needs a JSONL rl.prompts.file', prompts or "(built-in prompts)",
                'set rl.prompts.file to a .jsonl file of {"prompt": ..., "image": "frames/0.png"} rows (paths relative to it)')
    elif table.source not in FILE_SOURCES:
        try:
            suite = suites.get(table.source)
        except suites.UnknownSuite as exc:
            r.error("model.condition.source", f"names no source of given frames: {exc.problem}", table.source,
                    f'use "image", or a suite that gives frames ({", ".join(_frame_suites())}); {exc.fix}')
            return
        if suite.keys_windows != bool(kind.action_mode):
            if suite.keys_windows:
                r.error("model.condition.source", f"names the episode suite {suite.name!r}, whose rows are window keys for an action "
                        f"mode, and model.condition.kind is {kind.name!r}", table.source, 'set model.condition.kind = "forward_dynamics"')
            # an action mode from a suite that keys no windows: _online_world_rules says so
        elif not suite.gives_frames and not suite.keys_windows:
            r.error("model.condition.source", f"names the suite {suite.name!r}, which gives no frames", table.source,
                    f'use "image", or a suite that gives frames ({", ".join(_frame_suites())})')
        elif not prompts and suite.keys_windows:
            r.error("rl.prompts.file", f"is empty, and model.condition.source = {suite.name!r} takes each prompt row as a {suite.title} "
                    "window key (the built-in prompts are image captions)", "(built-in prompts)",
                    f"write the keys with {suite.prompt_source.split(' (')[0]} and set rl.prompts.file to that file")  # fmt: skip
        elif not prompts:
            r.error("model.condition.source", "renders the suite's ground truth of each caption, and the built-in prompts "
                    "are image captions, not the suite's captions", "(built-in prompts)",
                    f"set rl.prompts.file, e.g. shapes_video_train.txt ({suite.prompt_source or 'prompts of the suite'})")  # fmt: skip


def action_rules(c: schema.RunConfig, kind, r: Rules) -> None:
    """The world model's action modes: `[model.action]` names an embodiment exactly when the kind is
    an action mode, its normalisation fits the embodiment's width, and (this release) SFT trains it
    on every window of a LeRobot dataset, or NFT (forward dynamics or policy) or GRPO (forward
    dynamics) on an episode suite's window keys."""
    a, rl = c.model.action, c.rl
    lerobot = getattr(getattr(rl, "data", None), "lerobot", "")
    modes = list(c.model.condition.modes)
    if modes and not kind.action_mode:
        r.error("model.condition.modes", "are the action modes an SFT window draws from, and model.condition.kind is no action mode",
                modes, "remove it, or set model.condition.kind to one of them")
    elif modes:
        unknown = [m for m in modes if m not in ACTION_MODES]
        if unknown or kind.action_mode not in modes or len(set(modes)) != len(modes):
            r.error("model.condition.modes", f"must be distinct action modes ({', '.join(ACTION_MODES)}) that include the kind, {kind.name!r}",
                    modes, f'e.g. ["{kind.name}", "policy", "inverse_dynamics"]')
        if not isinstance(rl, schema.SFTConfig):
            r.error("model.condition.modes", "mix the action modes of SFT's training windows; an online run samples one mode", modes, "remove it")
    if not kind.action_mode:
        if a.embodiment or a.offset or a.scale:
            r.error("model.action", "describes the action rows of an action-mode condition, and model.condition.kind is "
                    f"{kind.name!r}", a.embodiment or "(offset/scale)", 'remove [model.action], or set model.condition.kind = "forward_dynamics"')
        if lerobot:
            r.error("rl.data.lerobot", "gives episodes with actions, which only an action-mode condition trains on", lerobot,
                    'set [model.condition] kind = "forward_dynamics" (or "policy", "inverse_dynamics"), source = "data"')
        return
    if a.embodiment not in EMBODIMENT_WIDTHS:
        r.error("model.action.embodiment", f"{kind.name} reads and writes one embodiment's action rows", a.embodiment or "(empty)",
                f"set it to one of {', '.join(sorted(EMBODIMENT_WIDTHS))}")
    else:
        width = EMBODIMENT_WIDTHS[a.embodiment]
        if bool(a.offset) != bool(a.scale):
            r.error("model.action.offset", "and model.action.scale come together (the row is (raw - offset) / scale)",
                    a.offset or a.scale, "give both, or neither")
        for key, values in (("offset", a.offset), ("scale", a.scale)):
            if values and (len(values) != width or not all(math.isfinite(float(v)) for v in values)):
                r.error(f"model.action.{key}", f"needs {width} finite numbers, one per {a.embodiment} action column", values,
                        f"give {width} numbers")
        if a.scale and any(float(v) == 0.0 for v in a.scale):
            r.error("model.action.scale", "divides the actions: no entry may be 0", a.scale, "use e.g. 256 per Push-T column")
        _folder_action_heads(c, a.embodiment, width, r)
    execute, chunk = a.execute, c.model.num_frames - 1
    if execute and (kind.action_mode != "policy" or algorithms.of(c).conditioned_from != "rollout"):
        r.error("model.action.execute", "is how many generated action rows a policy-mode online run executes for its reward, and "
                f"this run generates none to execute (model.condition.kind {kind.name!r}, rl.algorithm {algorithms.of(c).name!r})",
                execute, 'remove it, or train model.condition.kind = "policy" with rl.algorithm = "nft"')
    elif not 0 <= execute <= chunk:
        r.error("model.action.execute", f"must be in [0, {chunk}]: a generated chunk has model.num_frames - 1 = {chunk} rows (0: all of them)",
                execute, f"use 0 (the whole chunk) or 1 to {chunk}")
    if a.view_point and a.view_point not in VIEW_POINTS:
        r.error("model.action.view_point", "names no camera view of the structured caption", a.view_point,
                f"use one of {', '.join(VIEW_POINTS)}, or \"\" for none")
    if algorithms.of(c).conditioned_from == "rollout":  # an online run (NFT, GRPO): each rollout given a window's frame 0 and actions
        _online_world_rules(c, kind, r)
        return
    if algorithms.of(c).conditioned_from == "pairs":  # DPO: each pair's key gives frame 0 and the action rows
        _pairs_world_rules(c, kind, r)
        return
    if not isinstance(rl, schema.SFTConfig):
        r.error("model.condition.kind", f"{kind.name} trains with rl.algorithm = \"sft\" (or \"nft\", \"grpo\" or \"dpo\" in forward_dynamics) in this release",
                kind.name, "train the world model with sft on a LeRobot dataset (rl.data.lerobot), or nft or grpo on a suite's windows")
        return
    other = [name for name in ("jsonl", "shards") if getattr(rl.data, name)]
    if other and not lerobot:  # no source at all is sft.py's to say
        r.error(f"rl.data.{other[0]}", f"holds captioned images or clips, and {kind.name} trains on episodes (frames with their actions)",
                getattr(rl.data, other[0]), f"replace it with rl.data.lerobot, a LeRobot-format dataset folder")
    if c.model.condition.probability != 1.0:
        r.error("model.condition.probability", f"{kind.name} trains every window under its mode", c.model.condition.probability, "remove it (1)")
    if rl.eval.every:
        r.error("rl.eval.every", f"evaluates held-out prompts, and a {kind.name} run has episodes, not prompts, in this release",
                rl.eval.every, "set rl.eval.every = 0")


def _online_world_rules(c: schema.RunConfig, kind, r: Rules) -> None:
    """An online algorithm (NFT, GRPO) on the world model (trainers/online.py): forward dynamics (or,
    NFT, policy without one-step-off scoring), rows that are an episode suite's training-window keys,
    LoRA, no prompt evaluation."""
    table, name = c.model.condition, algorithms.of(c).name
    modes = ("forward_dynamics", "policy") if name in POLICY_ALGORITHMS else ("forward_dynamics",)
    if kind.action_mode not in modes:
        r.error("model.condition.kind", f"{name} trains the world model in {' or '.join(modes)} in this release, not {kind.name}", kind.name,
                'set model.condition.kind = "forward_dynamics" (or train this mode with sft'
                + (', or with rl.algorithm = "nft")' if kind.action_mode == "policy" else ")"))
    if kind.action_mode == "policy" and name in POLICY_ALGORITHMS and c.rl.async_reward:
        r.error("rl.async_reward", f"{name} in policy mode scores each rollout with its generated action rows, which the one-step-off "
                "pending rollout (and its checkpoint) does not keep in this release", True, "set rl.async_reward = false")
    if table.source not in FILE_SOURCES:
        try:
            suite = suites.get(table.source)
        except suites.UnknownSuite:
            suite = None  # condition_rules names the unknown source
        if suite is not None and not suite.keys_windows:
            r.error("model.condition.source", f"rl.algorithm = \"{name}\" in {kind.name} takes rows that are an episode suite's training-window keys, and "
                    f"{suite.name!r} keys none", table.source, f'use one that does ({", ".join(_keyed_suites())})')
    elif table.source != "data":  # "data" is condition_rules' own message
        r.error("model.condition.source", f"rl.algorithm = \"{name}\" in {kind.name} takes rows that are an episode suite's training-window keys (frame 0, "
                "actions and true states rebuilt from each key)", table.source, f'use a suite that keys them ({", ".join(_keyed_suites())})')
    _world_run_rules(c, kind, name, r)


def _pairs_world_rules(c: schema.RunConfig, kind, r: Rules) -> None:
    """DPO on the world model (trainers/dpo_world.py): forward dynamics, pairs whose prompts are an
    episode suite's training-window keys (mined, never generated), LoRA, no prompt evaluation. What
    a `mine.json` beside the shards says of them is checked against the run in `preflight.dpo`."""
    rl, table, name = c.rl, c.model.condition, algorithms.of(c).name
    if kind.action_mode != "forward_dynamics":
        r.error("model.condition.kind", f"{name} trains the world model in forward_dynamics in this release, not {kind.name}", kind.name,
                'set model.condition.kind = "forward_dynamics" (or train this mode with sft)')
    suite = None
    if table.source not in FILE_SOURCES:
        try:
            suite = suites.get(table.source)
        except suites.UnknownSuite:
            suite = None  # condition_rules names the unknown source
    if table.source in FILE_SOURCES or (suite is not None and not suite.keys_windows):  # an unknown suite: condition_rules says so
        r.error("model.condition.source", f"rl.algorithm = \"{name}\" in {kind.name} reads pairs whose prompts are an episode suite's "
                "training-window keys (frame 0 and the action rows rebuilt from each key)", table.source,
                f'use a suite that keys them ({", ".join(_keyed_suites())})')
    mine = f"mine them with cosmos-rl pairs mine --reward {suite.rewards[0].name} and set" if suite is not None and suite.keys_windows else "set"
    for key in ("rl.data", "rl.validation.data"):
        data = rl.data if key == "rl.data" else rl.validation.data
        if data.synthetic_pairs:
            r.error(f"{key}.synthetic_pairs", f"generates pairs of captions, and {name} in {kind.name} trains pairs of window keys' "
                    "predicted futures", data.synthetic_pairs, f"{mine} {key}.shards")
    if table.probability != 1.0:
        r.error("model.condition.probability", f"{name} in {kind.name} conditions every pair on its key's frame 0 and actions",
                table.probability, "remove it (1)")
    _world_run_rules(c, kind, name, r)


def _world_run_rules(c: schema.RunConfig, kind, name: str, r: Rules) -> None:
    """What every online or pair run on the world model shares: LoRA, and no prompt evaluation."""
    if c.model.lora.rank == 0:
        r.error("model.lora.rank", f"{name} on {kind.name} trains LoRA adapters (the action heads no loss reaches stay untouched)", 0,
                "set model.lora.rank > 0")
    if c.rl.eval.every:
        r.error("rl.eval.every", f"evaluates held-out prompts, and a {kind.name} run has episode windows; score it with "
                "cosmos-rl eval RUN --suite SUITE after training", c.rl.eval.every, "set rl.eval.every = 0")


# Online algorithms that train the world model in policy mode too (the rollouts generate action rows
# and the loss covers them: trainers/nft.py); the others (GRPO) train forward dynamics alone.
POLICY_ALGORITHMS = ("nft",)


def _keyed_suites() -> list[str]:
    return [s.name for s in suites.builtin_suites() if s.keys_windows]


def _folder_action_heads(c: schema.RunConfig, embodiment: str, width: int, r: Rules) -> None:
    """The model's transformer has action heads that take the embodiment: action_gen, a projection
    for its domain id, at least its width of columns. A model folder's config.json is read bounded;
    a preset's config is `models.architectures.PRESET_ARCHITECTURES`' (nothing is loaded)."""
    if c.model.path:
        path = r.base_dir / c.model.path / "transformer" / "config.json"
        if not path.is_file():
            return  # the folder's own problems are model.py's
        try:
            config = read_config(path, "transformer/config.json")
        except FolderProblem:
            return  # reported by the folder rules
    elif c.model.preset in PRESET_ARCHITECTURES:
        config = PRESET_ARCHITECTURES[c.model.preset][0]
        if not config.get("action_gen"):
            with_heads = sorted(name for name, (t, _) in PRESET_ARCHITECTURES.items() if t.get("action_gen"))
            r.error("model.preset", "builds no action heads, and an action-mode condition reads and writes action rows",
                    c.model.preset, f"use a preset with them ({', '.join(with_heads)}), or set model.path to a Cosmos3 folder whose transformer has them (Cosmos3-Nano)")  # fmt: skip
            return
    else:
        return  # no model named (model.py's)
    domain, have = EMBODIMENT_DOMAIN_IDS[embodiment], int(config.get("num_embodiment_domains", 0) or 0)
    if not config.get("action_gen"):
        problem = "its transformer has no action heads (action_gen is false)"
    elif domain >= have:
        problem = f"its transformer has {have} embodiment domain(s), and {embodiment} is domain {domain}"
    elif int(config.get("action_dim", 0) or 0) < width:
        problem = f"its transformer's action_dim {config.get('action_dim')} is narrower than {embodiment}'s {width} columns"
    else:
        return
    key, value = ("model.path", c.model.path) if c.model.path else ("model.preset", c.model.preset)  # a preset: heads for another embodiment
    r.error(key, f"{problem}, so it cannot read and write {embodiment} actions", value,
            "use a Cosmos3 folder built with action_gen = true and Cosmos3's 21 embodiment domains (Cosmos3-Nano)")


def _frame_suites() -> list[str]:
    return [s.name for s in suites.builtin_suites() if s.gives_frames or s.keys_windows]
