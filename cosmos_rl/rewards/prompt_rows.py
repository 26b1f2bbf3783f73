"""`validate --data` for an online run's prompt file, with what its rewards need of each row.

The prompt file itself (rows, conditioning frames) is `data.scan.prompt_data`'s; on top of it, a
video run whose built-in shapes image verifier scores each clip's frames against the caption's
static part (`multi.frame_prompt_rule`) has every row without one named here (a colour change, or
no moving-shapes caption at all), since the run would otherwise stop at the first rollout that
draws it. Lives in the rewards layer because the rule is the rewards'; `data/` sits below it.
"""

from __future__ import annotations

from pathlib import Path

from cosmos_rl.core import schema
from cosmos_rl.core.problems import Problem
from cosmos_rl.data import scan
from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards.frames import clip_twin, frame_suite_of
from cosmos_rl.rewards.multi import frame_prompt_rule, reward_terms


def prompt_data(config: schema.RunConfig, base: Path, full: bool) -> tuple[list[Problem], list[str]]:
    """`data.scan.prompt_data`, plus one problem per row a per-frame shapes reward cannot score, and
    per row of a world-model run that is no usable window key of its source (as the run's build
    would stop at it: `trainers.first_frames`)."""
    if config.model.num_frames == 1:
        return scan.prompt_data(config, base, full)
    return scan.prompt_data(config, base, full,
                            lambda path, rows: frame_caption_problems(config, path, rows) + window_key_problems(config, path, rows))  # fmt: skip


def window_key_problems(config: schema.RunConfig, path: Path, rows) -> list[str]:
    """One message per row that the run's episode suite (`[model.condition] source`, e.g. `lerobot`,
    `pusht`) cannot rebuild a window of (its metadata read, nothing decoded or simulated)."""
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.suites import registry as suites

    source = config.model.condition.source
    try:
        suite = suites.get(source) if source not in ("none", "image", "data") else None
    except suites.UnknownSuite:
        return []  # preflight names the source
    frames, height, width = scan.run_media(config)
    if suite is None or not suite.keys_windows or min(frames, height, width) < 1 or not config.model.fps > 0:
        return []  # no keyed rows, or a size preflight reports
    media, problems = MediaSpec(frames=frames, height=height, width=width, fps=float(config.model.fps)), []
    for row in rows:
        try:
            suite.window(row.prompt, media, check_only=True)
        except ValueError as exc:
            problems.append(f'{path}:{row.line}: model.condition.source = "{source}": {exc}; each row is a {suite.title} window key: '
                            f"write them with {suite.prompt_source.split(' (')[0]}")  # fmt: skip
    return problems


def frame_caption_problems(config: schema.RunConfig, path: Path, rows) -> list[str]:
    """One message per (reward, row) whose caption has no static part for a per-frame shapes reward."""
    problems = []
    for term in reward_terms(config.rl):
        rule = frame_prompt_rule(term)
        if rule is None:
            continue
        world, twin = frame_suite_of(term.name).title, clip_twin(term.name)
        for row in rows:
            try:
                part = rule(row.prompt)
            except (UserError, ValueError) as exc:
                part, why = None, f"is no {world} caption ({exc})"
            else:
                why = "is a colour change, which has no static part"
            if part is None:
                problems.append(
                    f"{path}:{row.line}: {term.key}.name = {term.name!r} scores each frame of a clip against its caption's "
                    f"static part, and {row.prompt!r} {why}; remove the row, or score whole clips with "
                    + (repr(twin) if twin else "a clip reward")
                )
    return problems
