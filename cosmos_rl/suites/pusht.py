"""The built-in episode suite over the Push-T world (`cosmos_rl.pusht`): `pusht`, a world model's
predictions judged by the simulator (`suites.base`, "An episode suite").

- **Held-out windows**: episodes made on the simulator from the split seed `SPLIT_SEED` (no
  training build may use it), `per_task` of each maker ("planner", then "random": the tasks),
  episode i of a task from the env's start for seed (SPLIT_SEED, task number, i), so a larger
  `per_task` adds episodes and keeps the earlier ones. Each episode runs `EPISODE_FRAMES` frames
  (or `chunk + 1` when longer) at the evaluation's frame size, and gives one window of `chunk + 1`
  frames, the middle one of its windows (after the planner's approach, while it pushes).
  `HELD_OUT_PER_TASK` episodes per task are the whole split (`per_task` 0).
- **Verifier per mode** (`judge`): forward dynamics and continuation, every generated frame against
  the true state (`pusht.verifier.verify_dynamics`: strict, every frame passes; partial, the mean
  per-frame score); inverse dynamics, each generated action row against the true one
  (`action_error`): a row passes within `ACTION_TOLERANCE_UNITS`, the agent check's own tolerance,
  strict = every row passes, partial = the share that pass, with the mean error in world units as
  `action_error`; policy, the generated actions executed from the window's true state
  (`verify_policy`): strict and partial are the generated video against the simulator's video of
  those actions, with `coverage_change` and the env's `reward` beside them.
- **Actions**: Cosmos3's `pusht` embodiment, the agent's target normalised as
  `pusht.episodes.action_spec` documents.

Reading the `Suite` value imports no world (its code is import strings); the functions here import
the world on their first call.
"""

from __future__ import annotations

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.suites.base import Suite, WindowVerdict

SPLIT_SEED = 50_000  # the held-out split; a training build of Push-T episodes must use another seed
TASKS = ("planner", "random")  # the episode makers, in report order
HELD_OUT_PER_TASK = 32  # episodes per task in the whole split (per_task 0)
EPISODE_FRAMES = 30  # frames per held-out episode (more when a window needs them)
ACTION_TOLERANCE_UNITS = 7.5  # world units: half the disc's radius, as the verifier's agent check
CONTINUATION = "continuation"  # leading frames given, no action rows (video to video, image to video)


def _size(media: MediaSpec) -> tuple[int, int]:
    return int(media.height), int(media.width)


def held_out_windows(per_task: int, media: MediaSpec) -> list:
    """The held-out windows (module docstring) of `media.frames` frames at `media`'s size."""
    import numpy as np

    from cosmos_rl.data.episodes import EpisodeWindow
    from cosmos_rl.pusht.episodes import planner_episode, random_episode
    from cosmos_rl.suites.base import spread

    if media.frames < 2:
        raise ValueError(f"a Push-T window has chunk + 1 >= 2 frames, got {media.frames}")
    count = HELD_OUT_PER_TASK if per_task <= 0 else min(per_task, HELD_OUT_PER_TASK)
    chunk = media.frames - 1
    length = max(EPISODE_FRAMES, media.frames)
    windows = []
    for number, (task, maker) in enumerate(zip(TASKS, (planner_episode, random_episode))):
        for i in range(count):
            seed = int(np.random.SeedSequence([SPLIT_SEED, number, i]).generate_state(1)[0])
            episode = maker(number * HELD_OUT_PER_TASK + i, seed, length, _size(media))
            start = spread(list(episode.windows(chunk)), 1)[0]
            windows.append(EpisodeWindow(episode=episode, start=start, chunk=chunk, task=task))
    return windows


def judge(mode: str, window, frames, actions, given: int) -> WindowVerdict:
    """One sample of `window` (module docstring): `frames` uint8 [chunk + 1, H, W, 3], `actions`
    [chunk, 2] world units."""
    import numpy as np

    from cosmos_rl.pusht.verifier import action_error, verify_dynamics, verify_policy

    if mode in ("forward_dynamics", CONTINUATION):
        verdict = verify_dynamics(frames, window.states, given=given)
        return WindowVerdict(strict=verdict.strict, partial=verdict.partial)
    if mode == "inverse_dynamics":
        true = np.asarray(window.actions, dtype=np.float64)
        predicted = np.asarray(actions, dtype=np.float64)
        errors = [action_error(predicted[i : i + 1], true[i : i + 1]).world for i in range(len(true))]
        passed = [error <= ACTION_TOLERANCE_UNITS for error in errors]
        return WindowVerdict(strict=float(all(passed)), partial=float(np.mean(passed)), metrics={"action_error": float(np.mean(errors))})
    if mode == "policy":
        verdict = verify_policy(frames, np.asarray(actions, dtype=np.float64), window.episode.states[0], window.lead_in, given=given)
        return WindowVerdict(strict=verdict.video.strict, partial=verdict.video.partial,
                             metrics={"coverage_change": verdict.coverage_change, "reward": verdict.reward})  # fmt: skip
    raise ValueError(f"mode {mode!r} is not forward_dynamics, inverse_dynamics, policy or {CONTINUATION}")


def action_spec(mode: str, chunk: int):
    from cosmos_rl.pusht.episodes import action_spec as spec

    return spec(mode, chunk)


PUSHT = Suite(
    name="pusht", title="Push-T", media=MediaSpec(frames=9, height=96, width=96, fps=10.0), rewards=(),
    tasks_of="cosmos_rl.suites.pusht:TASKS", held_out_title=f"Push-T held-out episodes (split seed {SPLIT_SEED})",
    held_out_windows="cosmos_rl.suites.pusht:held_out_windows", judge_window="cosmos_rl.suites.pusht:judge",
    action_spec="cosmos_rl.suites.pusht:action_spec",
)  # fmt: skip
