"""The Push-T world: gym-pusht's simulator (pymunk physics) as the ground truth a world model's
predicted futures are judged against. Cosmos3's `pusht` embodiment: one action row per frame, the
agent's target position (2 wide).

- `sim`: `PushTSim` (set a 10-number state, step, coverage, frames and masks at any size),
  `rollout`, `render_states`, `state_masks`, `world_to_pixel`, `STATE_FIELDS`;
- `episodes`: planner and random-action episodes as `data.episodes.Episode` (`planner_episode`,
  `random_episode`, `make_episodes`), the action normalisation (`action_spec`,
  `normalise_actions`, `denormalise_actions`: (a - 256) / 256);
- `verifier`: `verify_dynamics` (forward dynamics, continuation), `action_error` (inverse
  dynamics), `verify_policy` (policy), `judge_frame`; its module docstring is the suite's API;
- `closed_loop`: a policy acting in the simulator, receding horizon (`run_closed_loop`), the
  rewards it earns (`chunk_rewards`, `episode_outcome`) and the held-out initial states
  (`held_out_starts`);
- `windows`: training windows named by a key (`window_key`, `parse_key`, `training_keys`,
  `key_episode`): an online world-model run's prompt rows.

Nothing is imported here: gym-pusht pulls in pygame, OpenCV and gymnasium, which only the modules
that draw or step need.
"""
