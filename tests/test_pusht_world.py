"""The Push-T world: the simulator wrapper agrees with gym-pusht's env, episodes are deterministic,
masks agree with the rendering, and the verifiers score truth 1.0 and perturbed clips the fractions
worked out by hand from the states and the T's geometry."""

import numpy as np
import pytest

from cosmos_rl.pusht.episodes import (
    TASK, action_spec, denormalise_actions, make_episodes, normalise_actions, planner_episode, random_episode,
)
from cosmos_rl.pusht.sim import PushTSim, render_states, rollout, state_masks, world_to_pixel
from cosmos_rl.pusht.verifier import (
    AGENT_TOLERANCE_MIN_PX, AGENT_TOLERANCE_UNITS, BLOCK_IOU, action_error, agent_tolerance_px, colour_masks, verify_dynamics, verify_policy,
)

# A clip worked by hand: the T at (350, 150), angle 0 (bar x 290..410, y 150..180; stem x 335..365,
# y 180..270); the agent at (120, 380) holds still for two steps, then heads for (120, 60) along
# x = 120, never within 150 units of the T, so the T never moves.
START = np.array([120.0, 380.0, 350.0, 150.0, 0.0])
ACTIONS = np.array([[120.0, 380.0]] * 2 + [[120.0, 60.0]] * 6)  # 8 frames: 7 executed, the last planned
SIZE = 96
UNITS_PER_PX = 512 / SIZE
GT_ERROR_UNITS = 0.25 * UNITS_PER_PX  # the rendered disc's centroid is within 0.25 px of its centre


@pytest.fixture(scope="module")
def clip():
    states, _ = rollout(START, ACTIONS[:-1])
    return render_states(states, SIZE), states


def _agent_passes(shown: np.ndarray, true: np.ndarray) -> list[bool]:
    """Hand rule: a frame showing the agent at `shown` passes when it is within 7.5 units of `true`;
    each distance must be 0 or clear of the tolerance by the rendering's centroid error."""
    distance = np.hypot(*(shown[:, :2] - true[:, :2]).T)
    assert all(d == 0 or d > 7.5 + GT_ERROR_UNITS for d in distance), distance
    return [bool(d <= 7.5) for d in distance]


def _fraction(passes: list[bool]) -> float:
    # The block never moves in the hand clip, so each frame scores 1 (agent ok) or 1/2 (agent not).
    return float(np.mean([1.0 if ok else 0.5 for ok in passes]))


def test_hand_clip_agent_moves_as_worked_and_block_stays(clip):
    _, states = clip
    assert np.array_equal(states[:3, :2], np.repeat(START[None, :2], 3, axis=0))  # steps 0, 1: target = position
    assert np.all(states[:, 0] == 120.0) and np.all(np.diff(states[2:, 1]) < -10)  # then straight up, fast
    assert np.all(states[:, 2:5] == START[2:5]) and np.all(states[:, 7:] == 0.0)  # the T is untouched
    assert agent_tolerance_px(SIZE) == 7.5 * 96 / 512 == AGENT_TOLERANCE_UNITS / UNITS_PER_PX


def test_ground_truth_scores_one(clip):
    frames, states = clip
    verdict = verify_dynamics(frames, states, given=1)
    assert verdict.strict == 1.0 and verdict.partial == 1.0 and len(verdict.frames) == 7
    episode = planner_episode(0, seed=11, frames=12)  # with contact: the planner pushes the T
    assert np.abs(episode.states[-1, 2:5] - episode.states[0, 2:5]).max() > 1.0
    assert verify_dynamics(episode.frames, episode.states, given=1).strict == 1.0
    wide = random_episode(1, seed=5, frames=6, size=(64, 80))
    assert wide.frames.shape == (6, 64, 80, 3)
    assert verify_dynamics(wide.frames, wide.states, given=2).strict == 1.0  # continuation: 2 given


def test_frozen_clip(clip):
    frames, states = clip
    frozen = np.repeat(frames[:1], len(frames), axis=0)
    passes = _agent_passes(np.repeat(states[:1], len(states), axis=0)[1:], states[1:])
    assert passes == [True, True, False, False, False, False, False]  # still for frames 1, 2, then moving
    verdict = verify_dynamics(frozen, states, given=1)
    assert verdict.partial == pytest.approx(_fraction(passes)) == pytest.approx(9 / 14)  # (2 + 5 / 2) / 7
    assert verdict.strict == 0.0 and verdict.failed == [3, 4, 5, 6, 7]
    assert all(frame.block_ok for frame in verdict.frames)


def test_reversed_clip(clip):
    frames, states = clip
    passes = _agent_passes(states[::-1][1:], states[1:])
    assert not any(passes)  # 8 frames: no frame shows its own time, and no two shown positions are close
    verdict = verify_dynamics(frames[::-1].copy(), states, given=1)
    assert verdict.partial == pytest.approx(_fraction(passes)) == 0.5 and verdict.strict == 0.0


def test_one_frame_dropped(clip):
    frames, states = clip
    order = [0, 1, 3, 4, 5, 6, 7, 7]  # frame 2 dropped, the rest shifted up, the last repeated
    passes = _agent_passes(states[order][1:], states[1:])
    assert passes == [True, False, False, False, False, False, True]
    verdict = verify_dynamics(frames[order], states, given=1)
    assert verdict.partial == pytest.approx(_fraction(passes)) == pytest.approx(9 / 14)
    assert verdict.failed == [2, 3, 4, 5, 6]


def test_block_shifted(clip):
    frames, states = clip
    # 6 px at 96 = 32 units along the bar: the bar keeps (120 - 32) x 30 = 2640 of its 3600 units^2,
    # the 30-wide stem none of its 2700 (bar and stem lie in different rows, so they never cross),
    # so IoU = 2640 / (2 x 6300 - 2640) = 0.265 < 0.7: every judged frame fails its block, keeps its agent.
    shifted = states.copy()
    shifted[:, 2] += 6 * UNITS_PER_PX
    verdict = verify_dynamics(render_states(shifted, SIZE), states, given=1)
    assert verdict.strict == 0.0 and verdict.partial == 0.5
    assert all(f.agent_ok and not f.block_ok and f.block_iou < 0.265 + 0.1 for f in verdict.frames)
    # 1 unit: IoU = (30 x 119 + 90 x 29) / (2 x 6300 - 6180) = 0.963 >= 0.7: all pass.
    nudged = states.copy()
    nudged[:, 2] += 1.0
    assert verify_dynamics(render_states(nudged, SIZE), states, given=1).strict == 1.0
    assert BLOCK_IOU == 0.7


# The same clip at 32 x 32, where 7.5 units would be 0.47 px and the one-pixel floor binds: the
# tolerance is 1 px = 16 units. The agent's y, worked by hand from the env's PD control (ten 0.01 s
# steps of v += (100 (60 - y) - 20 v) 0.01, y += v 0.01 per frame, from rest at 380 after frame 2):
# 380, 380, 380, 285.39, 182.91, 121.56, 89.76, 74.16; steps of 94.6, 102.5, 61.4, 31.8, 15.6 units.
SMALL = 32
SMALL_UNITS_PER_PX = 512 / SMALL
HAND_Y = np.array([380.0, 380.0, 380.0, 285.39, 182.91, 121.56, 89.76, 74.16])


@pytest.fixture(scope="module")
def small_clip(clip):
    _, states = clip
    return render_states(states, SMALL), states


def _small_agent_passes(shown: list[int], judged: list[int]) -> list[bool]:
    """Hand rule at 32: frame index `shown[i]` shown at time `judged[i]` passes within 16 units; each
    distance must be 0 or clear of 16 by the rendering's centroid error (0.5 px = 8 units at 32)."""
    distance = np.abs(HAND_Y[shown] - HAND_Y[judged])
    assert all(d == 0 or abs(d - 16.0) > 8.0 for d in distance), distance
    return [bool(d <= 16.0) for d in distance]


def test_tolerance_has_a_one_pixel_floor(small_clip):
    _, states = small_clip
    assert np.allclose(states[:, 1], HAND_Y, atol=0.01)  # the simulator moves as worked by hand
    assert AGENT_TOLERANCE_MIN_PX == 1.0
    assert agent_tolerance_px(SMALL) == 1.0 and agent_tolerance_px(64) == 1.0  # 7.5 units: 0.47, 0.94 px
    assert agent_tolerance_px(SIZE) == 7.5 * 96 / 512 and agent_tolerance_px(128) == 1.875  # above the floor
    assert agent_tolerance_px((32, 96)) == 1.0  # the shorter side's scale


def test_small_ground_truth_scores_one_and_frozen_or_reversed_fail(small_clip):
    frames, states = small_clip
    truth = verify_dynamics(frames, states, given=1)
    assert truth.strict == 1.0 and truth.partial == 1.0
    # Frozen: frames 1, 2 show the agent where it is (still), 3-7 are 94.6-305.8 units off.
    passes = _small_agent_passes([0] * 7, list(range(1, 8)))
    assert passes == [True, True, False, False, False, False, False]
    frozen = verify_dynamics(np.repeat(frames[:1], 8, axis=0), states, given=1)
    assert frozen.partial == pytest.approx(_fraction(passes)) == pytest.approx(9 / 14) and frozen.strict == 0.0
    assert frozen.failed == [3, 4, 5, 6, 7]
    # Reversed: time i shows frame 7 - i, 102.5 (the middle pair) to 305.8 units off: all fail.
    passes = _small_agent_passes(list(range(6, -1, -1)), list(range(1, 8)))
    assert not any(passes)
    reversed_ = verify_dynamics(frames[::-1].copy(), states, given=1)
    assert reversed_.partial == pytest.approx(0.5) and reversed_.strict == 0.0


def test_small_frame_dropped(small_clip):
    frames, states = small_clip
    # Frames 0-6 with frame 2 dropped and the last repeated: times 2-5 show the next step, 94.6,
    # 102.5, 61.4 and 31.8 units off (all over 1 px); time 6 shows its own frame.
    order = [0, 1, 3, 4, 5, 6, 6]
    passes = _small_agent_passes(order[1:], list(range(1, 7)))
    assert passes == [True, False, False, False, False, True]
    verdict = verify_dynamics(frames[order], states[:7], given=1)
    assert verdict.partial == pytest.approx(_fraction(passes)) == pytest.approx(2 / 3)  # (2 + 4 / 2) / 6
    assert verdict.failed == [2, 3, 4, 5]


def test_inverse_dynamics_error():
    true = ACTIONS[:-1]
    exact = action_error(true, true)
    assert exact.world == 0.0 and exact.normalised == 0.0
    off = action_error(true + np.array([3.0, 4.0]), true)  # every row off by a 3-4-5 triangle
    assert off.world == pytest.approx(5.0) and off.normalised == pytest.approx(5.0 / 256)


def test_action_normalisation_is_offset_256_scale_256():
    assert np.allclose(normalise_actions([[0.0, 512.0], [256.0, 384.0]]), [[-1.0, 1.0], [0.0, 0.5]])
    assert np.allclose(denormalise_actions([[-1.0, 1.0], [0.0, 0.5]]), [[0.0, 512.0], [256.0, 384.0]])
    spec = action_spec("forward_dynamics", chunk=4)
    assert spec.domain_id == 4 and spec.width == 2 and spec.normalise([0.0, 384.0]) == (-1.0, 0.5)


def test_policy_replay_reproduces_the_recorded_coverage():
    episode = planner_episode(0, seed=11, frames=12)
    # The env's own step and reward, from the episode's first state: what the recording should say.
    env = PushTSim(episode.states[0]).env
    for action in episode.actions[:-1].astype(np.float64):
        _, _, _, _, info = env.step(action)
    verdict = verify_policy(episode.frames, episode.actions[:-1], episode.states[0])
    assert np.array_equal(verdict.states, episode.states)
    assert verdict.coverage_end == info["coverage"] and verdict.video.strict == 1.0
    # A window later in the episode: its start is the first state advanced by the actions before it.
    window = verify_policy(episode.frames[5:10], episode.actions[5:9], episode.states[0], lead_in=episode.actions[:5])
    assert np.array_equal(window.states, episode.states[5:10]) and window.video.strict == 1.0
    # Staying put from the goal pose: coverage 1 (the T on its own outline), reward 1, success.
    at_goal = verify_policy(render_states(np.array([[100.0, 100.0, 256.0, 256.0, np.pi / 4]] * 2)),
                            np.array([[100.0, 100.0]]), [100.0, 100.0, 256.0, 256.0, np.pi / 4])
    assert at_goal.coverage_end == pytest.approx(1.0) and at_goal.success and at_goal.coverage_change == pytest.approx(0.0)


def test_sim_step_matches_the_env_bit_for_bit():
    start = PushTSim.random_start(3)
    ours, theirs = PushTSim(start), PushTSim(start)
    for action in np.array([[250.0, 260.0], [300.0, 200.0], [310.0, 180.0], [200.0, 220.0]] * 3):
        ours.step(action)
        theirs.env.step(action)
    assert np.array_equal(ours.state(), theirs.state())


def test_episodes_are_deterministic_by_seed():
    a, b = planner_episode(0, seed=21, frames=8), planner_episode(0, seed=21, frames=8)
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.actions, b.actions) and np.array_equal(a.states, b.states)
    c = planner_episode(0, seed=22, frames=8)
    assert not np.array_equal(a.states, c.states)
    pair = make_episodes(2, seed=4, frames=6, random_share=0.5)
    again = make_episodes(2, seed=4, frames=6, random_share=0.5)
    assert [e.index for e in pair] == [0, 1] and all(np.array_equal(x.states, y.states) for x, y in zip(pair, again))
    assert a.fps == 10.0 and a.task == TASK and a.actions.shape == (8, 2) and a.states.shape == (8, 10)
    assert np.all((a.actions >= 30) & (a.actions <= 482))  # targets keep the disc inside the frame


def test_masks_agree_with_rendering_and_geometry(clip):
    frames, states = clip
    agents, blocks = state_masks(states[:1], SIZE)
    # Disc: pi 15^2 units^2 = 24.9 px at 96; T: 6300 units^2 plus its 2-unit outline along the 480-unit
    # perimeter, (6300 + 2 x 480) x (96 / 512)^2 = 255 px.
    assert abs(int(agents[0].sum()) - np.pi * 15**2 / UNITS_PER_PX**2) <= 3
    assert abs(int(blocks[0].sum()) - (6300 + 2 * 480) / UNITS_PER_PX**2) <= 10
    rows, cols = np.nonzero(agents[0])
    assert np.hypot(cols.mean() - world_to_pixel(START[:2], SIZE)[0], rows.mean() - world_to_pixel(START[:2], SIZE)[1]) <= 0.25
    for seed in range(4):
        state = PushTSim.random_start(seed)
        sim = PushTSim(state)
        agent, block = colour_masks(sim.render(SIZE))
        true_agent, true_block = sim.masks(SIZE)
        assert (block & true_block).sum() / (block | true_block).sum() >= 0.9
        assert (agent & true_agent).sum() / (agent | true_agent).sum() >= 0.8


def test_the_suites_pixel_classes_are_the_verifiers_and_reach_a_vae_loss_per_frame(clip):
    """`suites.pusht.pixel_classes` is 1 where the verifier counts agent pixels, 2 where it counts the
    T's; `trainers.sft.clip_classes` hands a [B, 3, F, H, W] clip to it and puts each frame's classes
    back in place (a clip whose frames differ: a misplaced frame or channel would show)."""
    import torch

    from cosmos_rl.suites.pusht import pixel_classes
    from cosmos_rl.trainers.sft import clip_classes

    frames, states = clip
    classes = pixel_classes(frames)
    agent, block = state_masks(states, SIZE)
    for i, frame in enumerate(frames):
        seen_agent, seen_block = colour_masks(frame)
        assert np.array_equal(classes[i] == 1, seen_agent) and np.array_equal(classes[i] == 2, seen_block)
        assert seen_agent.any() and (seen_agent & agent[i]).any() and (seen_block & block[i]).sum() > 0.7 * block[i].sum()
    video = torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0  # [1, 3, F, H, W] in [-1, 1]
    both = torch.cat([video, video.flip(2)])  # the second sample's frames in reverse order
    out = clip_classes(pixel_classes, both)
    assert out.shape == (2, 1, len(frames), SIZE, SIZE)
    assert np.array_equal(out[0, 0].numpy(), classes) and np.array_equal(out[1, 0].numpy(), classes[::-1])
