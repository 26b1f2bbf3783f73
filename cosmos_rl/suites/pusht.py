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

- **Training windows by key** (`window_of`, an online run's prompt rows with `[model.condition]
  source = "pusht"`): a key `pusht window seed=S task=T episode=I start=K length=L` names window
  K.. of episode I of maker T (planner, random) built from the env's start for seed
  (S, task number, I), as the held-out split is built from `SPLIT_SEED`, `L` frames long, so the
  window is rebuilt bit for bit in any process from the key alone (S = `SPLIT_SEED` is refused:
  that is the held-out split). `pusht.windows` holds the grammar (`window_key`, `parse_key`,
  `training_keys`), `python -m cosmos_rl.pusht windows` writes keys as a prompt file. The key is each rollout's prompt string, so the rewards
  `pusht_forward_strict` and `pusht_forward_partial` (`score_forward`) judge a clip against its
  key's true states with the forward-dynamics verifier (frame 0 given), in the reward service
  as anywhere else. In policy mode the reward `pusht_chunk_coverage` (`score_chunk`) scores the
  generated action rows instead: the coverage change they cause executed in the simulator from the
  key's true state (`pusht.chunk_reward`); the rows travel with the clip (the service's `actions`).

Reading the `Suite` value imports no world (its code is import strings); the functions here import
the world on their first call.
"""

from __future__ import annotations

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.suites.base import Suite, SuiteReward, WindowVerdict

SPLIT_SEED = 50_000  # the held-out split; a training build of Push-T episodes must use another seed
TASKS = ("planner", "random")  # the episode makers, in report order
HELD_OUT_PER_TASK = 32  # episodes per task in the whole split (per_task 0)
EPISODE_FRAMES = 30  # frames per held-out episode (more when a window needs them)
ACTION_TOLERANCE_UNITS = 7.5  # world units: half the disc's radius, as the verifier's agent check
CONTINUATION = "continuation"  # leading frames given, no action rows (video to video, image to video)


def window_of(key: str, media: MediaSpec, check_only: bool = False):
    """The training `EpisodeWindow` of `key` (module docstring): `media.frames` frames from its start,
    rendered at `media`'s size; ValueError for a bad key or a window past the episode's end.
    `check_only`: the key's checks alone (no simulation), None returned."""
    from cosmos_rl.data.episodes import EpisodeWindow
    from cosmos_rl.pusht.windows import key_episode, parse_key

    seed, task, episode, start, length = parse_key(key)
    chunk = media.frames - 1
    if chunk < 1 or start + chunk >= length:
        raise ValueError(f"{key!r}: a window of {media.frames} frames at frame {start} runs past the episode's {length} frames")
    if check_only:
        return None
    return EpisodeWindow(episode=key_episode(seed, task, episode, length, _size(media)), start=start, chunk=chunk, task=task)


def score_forward(clips, prompts, mode: str = "strict") -> list[float]:
    """Each clip (uint8 [N, F, H, W, 3]) judged in forward dynamics against the true states of the
    window its prompt (a key) names, frame 0 given: the verifier's `mode` score (strict or partial)."""
    import numpy as np

    from cosmos_rl.pusht.sim import FPS
    from cosmos_rl.pusht.verifier import verify_dynamics

    clips = np.asarray(clips)
    if mode not in ("strict", "partial"):
        raise ValueError(f"mode must be strict or partial, got {mode!r}")
    media = MediaSpec(frames=int(clips.shape[1]), height=int(clips.shape[2]), width=int(clips.shape[3]), fps=FPS)
    scores = []
    for clip, key in zip(clips, prompts):
        verdict = verify_dynamics(clip, window_of(key, media).states, given=1)
        scores.append(float(verdict.strict if mode == "strict" else verdict.partial))
    return scores


def score_chunk(clips, prompts, mode: str = "partial", actions=None) -> list[float]:
    """Each sample's generated action chunk judged by the simulator (`pusht.chunk_reward`): the
    coverage change its `actions` ([N, n, 2] world units, the leading `n` rows a policy-mode run
    executes, 1 <= n <= chunk) cause from the true state of the window its prompt (a key) names.
    The clips (uint8 [N, F, H, W, 3]) give the window's size and length; their pixels play no part."""
    import numpy as np

    from cosmos_rl.pusht.chunk_reward import chunk_coverage_change
    from cosmos_rl.pusht.sim import FPS

    if actions is None:
        raise ValueError("pusht_chunk_coverage scores each sample's generated action rows: send them with the clips (the request's actions)")
    clips, rows = np.asarray(clips), np.asarray(actions, dtype=np.float64)
    chunk = int(clips.shape[1]) - 1
    if rows.ndim != 3 or rows.shape[0] != len(prompts) or not 1 <= rows.shape[1] <= chunk or rows.shape[2] != 2:
        raise ValueError(f"pusht_chunk_coverage takes [N, n, 2] action rows, 1 <= n <= {chunk} (the clips' chunk), one per prompt; "
                         f"got {list(rows.shape)} for {len(prompts)} prompts")
    media = MediaSpec(frames=int(clips.shape[1]), height=int(clips.shape[2]), width=int(clips.shape[3]), fps=FPS)
    scores = []
    for key, executed in zip(prompts, rows):
        window = window_of(key, media)
        scores.append(chunk_coverage_change(window.episode.states[0], window.lead_in, executed))
    return scores


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


def pixel_classes(frames):
    """int8 [N, H, W]: 1 where the verifier sees the agent, 2 the block (T), 0 neither
    (`pusht.verifier.colour_masks`, the palette rule both checks count pixels by)."""
    import numpy as np

    from cosmos_rl.pusht.verifier import colour_masks

    frames = np.asarray(frames)
    out = np.zeros(frames.shape[:-1], dtype=np.int8)
    for i, frame in enumerate(frames):
        agent, block = colour_masks(frame)
        out[i][agent] = 1
        out[i][block] = 2
    return out


PUSHT = Suite(
    name="pusht", title="Push-T", media=MediaSpec(frames=9, height=96, width=96, fps=10.0),
    rewards=(
        SuiteReward(name="pusht_forward_strict", scorer="cosmos_rl.suites.pusht:score_forward", part="strict"),
        SuiteReward(name="pusht_forward_partial", scorer="cosmos_rl.suites.pusht:score_forward", part="partial"),
        SuiteReward(name="pusht_chunk_coverage", scorer="cosmos_rl.suites.pusht:score_chunk", part="partial", actions=True),
    ),
    tasks_of="cosmos_rl.suites.pusht:TASKS", held_out_title=f"Push-T held-out episodes (split seed {SPLIT_SEED})",
    held_out_windows="cosmos_rl.suites.pusht:held_out_windows", judge_window="cosmos_rl.suites.pusht:judge",
    action_spec="cosmos_rl.suites.pusht:action_spec", window_of="cosmos_rl.suites.pusht:window_of",
    prompt_source="python -m cosmos_rl.pusht windows OUT.txt --episodes N --frames F (training-window keys)",
    pixel_classes="cosmos_rl.suites.pusht:pixel_classes", pixel_class_names=("agent", "block"), preset="pusht",
)  # fmt: skip
