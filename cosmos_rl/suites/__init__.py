"""Suites: a world as a plugin (held-out prompts, a verifier with strict and partial scores, the
rewards it registers, the frames it gives a conditioned sample, its base preset), asked for by name
by `eval`, `[rl.eval]`, `pairs mine`, the reward registry and the conditioning sources.

`base` says what a suite is (`Suite`, `SuiteReward`), `registry` finds one by name (the built-ins,
or a `package.module:SUITE` import string for a suite outside the package), `shapes` holds the two
built-in suites over the shapes world (`shapes`, `shapes_video`), `pusht` the episode suite over
the Push-T world (`pusht`). Torch-free; reading a suite
imports no world.
"""
