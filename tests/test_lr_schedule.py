"""rl.optimizer's LR schedule: warm-up, then none / linear / cosine decay to a floor, checked against
values worked out by hand, through the trainers' AdamW + LambdaLR and across a checkpoint of the
schedule's counters (preflight's rules for the decay knobs: tests/test_preflight.py)."""

import pytest
import torch

from cosmos_rl.checkpoint.state import LRScheduleState
from cosmos_rl.core import schema
from cosmos_rl.models.lr_schedule import lr_factor
from cosmos_rl.models.setup import build_optimizer, optimizer_step


def factors(n: int, **knobs) -> list[float]:
    factor = lr_factor(schema.OptimizerConfig(**knobs))
    return [factor(k) for k in range(n)]


def test_warm_up_alone_ramps_then_holds():
    # (k + 1) / 4 for k = 0..3, then 1.
    assert factors(6, warmup_steps=4) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert factors(3) == [1.0, 1.0, 1.0]


def test_linear_decay_reaches_the_floor_at_decay_steps_and_stays():
    # No warm-up, 4 decay steps to 0: 1 - k/4.
    assert factors(6, decay="linear", decay_steps=4) == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    # Floor 0.2: 0.2 + 0.8 (1 - k/2) = 1, 0.6, 0.2, 0.2.
    assert factors(4, decay="linear", decay_steps=2, min_lr_ratio=0.2) == pytest.approx([1.0, 0.6, 0.2, 0.2])


def test_cosine_decay_after_a_warm_up():
    # Warm-up 2 (0.5, 1), then p = (k - 2) / 4 from 1 to the floor 0.1 by 0.1 + 0.9 (1 + cos(pi p)) / 2:
    # p = 0: 1; p = 1/4: cos = 0.70710678, 0.1 + 0.9 x 0.85355339 = 0.86819805; p = 1/2: 0.55;
    # p = 3/4: 0.1 + 0.9 x 0.14644661 = 0.23180195; p = 1: 0.1; after: 0.1.
    expected = [0.5, 1.0, 1.0, 0.86819805, 0.55, 0.23180195, 0.1, 0.1]
    assert factors(8, warmup_steps=2, decay="cosine", decay_steps=6, min_lr_ratio=0.1) == pytest.approx(expected, abs=1e-8)


def test_the_optimizer_takes_each_step_at_the_scheduled_lr_and_a_restored_schedule_goes_on_the_same():
    cfg = schema.OptimizerConfig(lr=2.0, decay="linear", decay_steps=4)
    param = torch.nn.Parameter(torch.zeros(3))

    def run(optimizer, schedule, steps):
        used = []
        for _ in range(steps):
            param.grad = torch.ones(3)
            used.append(optimizer_step([param], optimizer, schedule, grad_clip=0.0)[1])
        return used

    optimizer, schedule = build_optimizer([param], cfg)
    assert run(optimizer, schedule, 2) == [2.0, 1.5]
    saved = LRScheduleState(schedule).capture()
    # A resumed run rebuilds the lambda from the config and loads only the counters.
    optimizer2, schedule2 = build_optimizer([param], cfg)
    LRScheduleState(schedule2).restore(saved)
    # The restored schedule sets the next step's LR from the counter; the optimizer's own LR comes
    # back with the optimizer state in a real resume, so copy it here the same way.
    optimizer2.load_state_dict(optimizer.state_dict())
    assert run(optimizer2, schedule2, 3) == [1.0, 0.5, 0.0]
    assert run(optimizer, schedule, 3) == [1.0, 0.5, 0.0]
