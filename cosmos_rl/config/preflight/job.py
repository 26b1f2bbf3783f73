"""Preflight rules of the run itself: `[job]` (name, logging), its length and `[checkpoint]`."""

from __future__ import annotations

import importlib.util
import re

from cosmos_rl.config.preflight.rules import Rules
from cosmos_rl.core import schema


def job_rules(c: schema.RunConfig, r: Rules) -> None:
    """The run's name and loggers, rl.max_steps and how often it checkpoints (job.seed: the entry's
    `common_rules`, which keeps the order problems are reported in)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", c.job.name):
        r.error("job.name", "must be a plain folder name (letters, digits, '.', '_', '-')", c.job.name, "rename the run")
    r.at_least("job.log_every", c.job.log_every, 1)
    r.positive("job.progress_every_s", c.job.progress_every_s)
    # find_spec looks the logger up without importing it (validate stays fast).
    if c.job.tensorboard and importlib.util.find_spec("tensorboard") is None:
        r.error("job.tensorboard", "the tensorboard package is not installed", True, "pip install tensorboard, or set job.tensorboard = false")
    if c.job.wandb_project and importlib.util.find_spec("wandb") is None:
        r.error("job.wandb_project", "the wandb package is not installed", c.job.wandb_project, 'pip install wandb, or set job.wandb_project = ""')
    if c.job.wandb_entity and not c.job.wandb_project:
        r.error("job.wandb_entity", "set without job.wandb_project, so nothing would be logged", c.job.wandb_entity, "set job.wandb_project too, or remove it")
    r.at_least("rl.max_steps", c.rl.max_steps, 1)
    r.at_least("checkpoint.every", c.checkpoint.every, 0)
    r.at_least("checkpoint.keep", c.checkpoint.keep, 0)
