"""Suites: a world as a plugin (held-out prompts, a verifier with strict and partial scores, the
rewards it registers, the frames it gives a conditioned sample, its base preset), asked for by name
by `eval`, `[rl.eval]`, `pairs mine`, the reward registry and the conditioning sources."""
