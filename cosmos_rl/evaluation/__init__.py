"""Evaluation on held-out prompts: `cosmos-rl eval TARGET` and `[rl.eval]` during training (docs/eval.md).

Modules, one concern each (the first six torch-free):

* ``prompts``: which images an evaluation makes (held-out captions x seed indices), the rank split;
* ``intervals``: 95% bootstrap intervals over prompts, and the paired difference against a base;
* ``scores``: scoring images with a built-in reward, per-task and per-prompt totals that add across ranks;
* ``grid``: the labelled sample sheet (tiles upscaled, caption and verdict under each);
* ``hacking``: the reward-hacking watch (training signal up, ``eval/score`` down);
* ``during``: ``with_eval``, the ``[rl.eval]`` hook around ``trainers.loop.run_steps``;
* ``evaluator``: sampling and scoring with one model, the same noise on every call;
* ``target``: a run directory (its newest checkpoint and its base) or a model;
* ``command``: the command itself, its result object, the grid's rows and the table.
"""
