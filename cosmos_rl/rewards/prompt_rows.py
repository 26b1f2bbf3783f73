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
    """`data.scan.prompt_data`, plus one problem per row a per-frame shapes reward cannot score."""
    if config.model.num_frames == 1:
        return scan.prompt_data(config, base, full)
    return scan.prompt_data(config, base, full, lambda path, rows: frame_caption_problems(config, path, rows))


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
