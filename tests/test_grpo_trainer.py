"""The GRPO step driven in one process playing both ranks of a group (tests/_nft_local.py): the
rollout's recorded old log-prob is the policy's own (ratio 1 at the one update), a step moves the
weights with finite metrics, the seed contract reproduces rollouts, one initial noise a group, the
fast variant's window, two updates a step on slices of the step's prompts, the moving average; and
the torch-free preflight/plan step counts agree with the sampler's."""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from cosmos_rl.planning import plan
from cosmos_rl.algorithms import grpo_sampler
from cosmos_rl.algorithms.grpo import STEP_DYNAMICS, cps_step_mean_std, sde_step_mean_std, step_log_prob
from cosmos_rl.config import load, preflight
from cosmos_rl.config.preflight.grpo import GRPO_SCHEDULERS, trained_step_count

from _nft_local import local_trainer

# Tiny and fast: 2 ranks x 1 row, 3 sampler steps (SDE on 0 and 1; both train), CFG 2 (both
# branches in one forward), the KL weighed, a learning rate large enough to move a LoRA adapter.
RAW = {
    "job": {"name": "grpo", "seed": 0, "progress": False},
    "model": {"preset": "tiny", "image_size": 32, "lora": {"rank": 4, "alpha": 8.0}},
    "grid": {"backend": "ray", "device": "cpu"},
    "rl": {
        "algorithm": "grpo", "init_from": "preset:tiny", "group_size": 2, "prompts_per_step": 1,
        "sample_steps": 3, "guidance": 2.0, "max_steps": 2, "sample_grid_every": 0, "kl_beta": 0.04,
        "reward": {"name": "brightness", "revision": "builtin-v1"}, "optimizer": {"lr": 1e-2},
    },
    "checkpoint": {"every": 0, "keep": 0},
}  # fmt: skip


def _config(tmp_path, **rl):
    raw = {**RAW, "job": {**RAW["job"], "output_dir": str(tmp_path)}, "rl": {**RAW["rl"], **rl}}
    config = load.structure(raw)
    assert [p.render() for p in preflight.check(config) if p.severity == "error"] == []
    return config


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    built = local_trainer(_config(root), root / "run")
    built.build(resume=False)
    return built


def _policy_tensors(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.transformer.named_parameters() if p.requires_grad}


def _rollout(trainer, step):
    rows = trainer.cursor.next_batch(trainer.prompts)
    cond, uncond = trainer._tokens([row for row, _ in rows])
    return trainer.rollout(step, cond, uncond), {rank: trainer.replay[rank] for rank in trainer.comm.ranks}


def test_the_recorded_log_prob_is_the_policys_own_and_a_step_moves_the_weights(trainer):
    """Before any update the policy is the sampling policy, so recomputing each recorded step's
    mean from its x with the policy gives back the recorded log-prob of x_next exactly (ratio 1,
    approx_kl 0). Then one train_step: finite metrics, ratio 1 and no clipped sample at its one
    update, KL 0 at step 1 (LoRA starts at B = 0: the policy is the reference), and the policy
    adapter moved."""
    cursor = trainer.cursor.state_dict()
    _, replay = _rollout(trainer, 1)
    trainer.cursor.load_state_dict(cursor)
    (cond, uncond), records = replay[0]
    assert [r.index for r in records] == [0, 1]  # every step but the last is an SDE step
    from cosmos_rl.trainers.grpo import guided_velocity

    with torch.no_grad():
        for r in records:
            v = guided_velocity(trainer.transformer, (cond, uncond), 2.0, r.x, r.sigma.expand(1))
            mean, std = sde_step_mean_std(r.x, v, r.sigma, r.sigma_next, 0.7)
            assert torch.equal(step_log_prob(r.x_next, mean, std), r.log_prob)

    before = _policy_tensors(trainer)
    metrics = trainer.train_step(1)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["train/ratio_mean"] == 1.0 and metrics["train/approx_kl"] == 0.0
    assert metrics["train/clip_fraction"] == 0.0 and metrics["train/kl"] == 0.0
    assert metrics["train/grad_norm"] > 0.0
    after = _policy_tensors(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_a_rollout_runs_the_text_tower_once_and_holds_nothing_after_it(trainer):
    """The default targets put adapters on the text tower, yet inside one rollout (the policy's
    adapter fixed, no grad) the text keys/values are computed by the first forward and read by the
    other five (2 ranks x 3 sampler steps of the same prompts); none outlive the rollout. That the
    reused forwards give the recorded log-probs exactly is the first test's check."""
    from cosmos_rl.models import text_kv

    cache = text_kv.cache_of(trainer.transformer)
    cursor, before = trainer.cursor.state_dict(), dict(cache.counts)
    _rollout(trainer, 3)
    trainer.cursor.load_state_dict(cursor)
    trainer.replay.clear()
    assert {k: cache.counts[k] - before[k] for k in before} == {"record": 1, "reuse": 5}
    assert not cache.entries


def test_the_seed_contract_reproduces_rollouts_and_ranks_and_steps_differ(trainer):
    """A rollout depends on (job.seed, rank, step) only: rolling step 5 out twice (the weights
    unchanged in between) gives the same latents, records and pixels; the two ranks and step 6
    draw other noise."""
    cursor = trainer.cursor.state_dict()
    first, replay_a = _rollout(trainer, 5)
    trainer.cursor.load_state_dict(cursor)
    again, replay_b = _rollout(trainer, 5)
    trainer.cursor.load_state_dict(cursor)
    other_step, _ = _rollout(trainer, 6)
    trainer.cursor.load_state_dict(cursor)
    for (x_a, s_a, p_a), (x_b, s_b, p_b) in zip(first, again):
        assert torch.equal(x_a, x_b) and torch.equal(s_a, s_b) and torch.equal(p_a, p_b)
    for rank in (0, 1):
        for a, b in zip(replay_a[rank][1], replay_b[rank][1], strict=True):
            assert torch.equal(a.x_next, b.x_next) and torch.equal(a.log_prob, b.log_prob)
    assert not torch.equal(first[0][0], first[1][0])  # rank 0 and rank 1
    assert not torch.equal(first[0][0], other_step[0][0])
    # The sigmas are the model's own sampler's (UniPC's, what evaluation samples at), without the appended 0.
    from cosmos_rl.models.sampling import sampler_sigmas

    assert torch.equal(first[0][1], sampler_sigmas(3, None, trainer.model.parts)[:-1])


def test_one_initial_noise_a_group_and_the_seed_contract_names_it_only_when_set(trainer):
    """rl.same_initial_noise = true: both ranks start step 5 from rank 0's own initial noise (the
    first SDE record's x is the initial noise), while their SDE steps still draw their own noise
    (x_next differs). The seed contract carries the key only when set, so runs from before the
    knob keep their contract and identity."""
    cursor = trainer.cursor.state_dict()
    _, own = _rollout(trainer, 5)
    trainer.cursor.load_state_dict(cursor)
    plain = trainer.rl
    trainer.rl = attrs.evolve(plain, same_initial_noise=True)
    try:
        _, shared = _rollout(trainer, 5)
        trainer.cursor.load_state_dict(cursor)
        first = [shared[rank][1][0] for rank in (0, 1)]
        assert first[0].index == 0 and torch.equal(first[0].x, own[0][1][0].x)
        assert torch.equal(first[1].x, first[0].x) and not torch.equal(own[1][1][0].x, own[0][1][0].x)
        assert not torch.equal(first[1].x_next, first[0].x_next)
        config = attrs.evolve(trainer.config, rl=trainer.rl)
        assert plan.seed_contract(config)["rl.same_initial_noise"] is True
        assert "rl.same_initial_noise" not in plan.seed_contract(attrs.evolve(config, rl=plain))
    finally:
        trainer.rl = plain
        trainer.replay.clear()


def test_the_cps_scheduler_samples_and_trains_with_the_same_step(trainer):
    """rl.scheduler = "cps", eta 0.8: each SDE record's std is s' sin(0.4 pi), its recorded log-prob
    is the CPS step's of the policy (not the Flow-SDE step's), and the training half's loss
    recomputes it (ratio 1 on both records): rollout and learn use one step rule. Preflight's
    scheduler names are the math module's."""
    assert set(GRPO_SCHEDULERS) == set(STEP_DYNAMICS)
    plain = trainer.rl
    trainer.rl = attrs.evolve(plain, scheduler="cps", noise_level=0.8)
    try:
        cursor = trainer.cursor.state_dict()
        _, replay = _rollout(trainer, 4)
        trainer.cursor.load_state_dict(cursor)
        ids, records = replay[0]
        from cosmos_rl.trainers.grpo import guided_velocity

        for r in records:
            assert torch.allclose(r.std, r.sigma_next * math.sin(0.4 * math.pi) * torch.ones(1))
            with torch.no_grad():
                v = guided_velocity(trainer.transformer, ids, 2.0, r.x, r.sigma.expand(1))
                mean, std = cps_step_mean_std(r.x, v, r.sigma, r.sigma_next, 0.8)
                sde_mean, sde_std = sde_step_mean_std(r.x, v, r.sigma, r.sigma_next, 0.8)
            assert torch.equal(step_log_prob(r.x_next, mean, std), r.log_prob)
            assert not torch.allclose(step_log_prob(r.x_next, sde_mean, sde_std), r.log_prob)
            _, metrics = trainer._step_loss(r, ids, torch.ones(1), measure_kl=True)
            assert float(metrics["ratio_mean"]) == 1.0 and math.isfinite(float(metrics["kl"]))
    finally:
        trainer.rl = plain
        trainer.replay.clear()


def test_the_kl_form_scales_the_trained_steps_kl_by_the_step_size(trainer):
    """rl.kl_form = "reference" (Flow-GRPO's code): the KL the training half weighs is the exact
    one times s - s' on every `sde` record, the policy loss the same; "exact" is the default."""
    assert trainer.rl.kl_form == "exact" and trainer.rl.scheduler == "sde"
    plain = trainer.rl
    saved = _policy_tensors(trainer)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # move the policy off the reference, so the KL is not 0
        for p in trainer.transformer.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    try:
        cursor = trainer.cursor.state_dict()
        _, replay = _rollout(trainer, 5)
        trainer.cursor.load_state_dict(cursor)
        ids, records = replay[0]
        for r in records:
            _, exact = trainer._step_loss(r, ids, torch.ones(1), measure_kl=True)
            trainer.rl = attrs.evolve(plain, kl_form="reference")
            _, reference = trainer._step_loss(r, ids, torch.ones(1), measure_kl=True)
            trainer.rl = plain
            step = float(r.sigma - r.sigma_next)
            assert 0 < step < 1 and float(exact["kl"]) > 0
            assert float(reference["kl"]) == pytest.approx(float(exact["kl"]) * step, rel=1e-5)
            assert float(reference["policy_loss"]) == float(exact["policy_loss"])
    finally:
        trainer.rl = plain
        trainer.replay.clear()
        with torch.no_grad():
            for n, p in trainer.transformer.named_parameters():
                if n in saved:
                    p.copy_(saved[n])


def test_the_fast_variant_draws_one_window_per_step_the_same_on_every_rank(trainer):
    """rl.sde_window = 1 over 3 steps (window range: steps 0-1): the window start is drawn from
    (job.seed, step), so both ranks' rollouts have one SDE record at the same index, the step
    trains exactly it, and over 12 steps both starts occur. (The same built trainer with its rl
    table switched to the fast variant: the rule reads rl only.)"""
    plain = trainer.rl
    trainer.rl = attrs.evolve(plain, sde_window=1)
    try:
        starts = [trainer.sde_steps(step) for step in range(1, 13)]
        assert {tuple(s) for s in starts} == {(0,), (1,)} and starts == [trainer.sde_steps(s) for s in range(1, 13)]
        cursor = trainer.cursor.state_dict()
        _, replay = _rollout(trainer, 3)
        trainer.cursor.load_state_dict(cursor)
        window = trainer.sde_steps(3)
        assert [[r.index for r in replay[rank][1]] for rank in (0, 1)] == [window, window]
        assert trainer.trained_steps(window) == window
    finally:
        trainer.rl = plain
        trainer.replay.clear()


@pytest.mark.parametrize("steps", [2, 3, 10, 17, 100])
def test_preflight_counts_the_trained_steps_as_the_sampler_does(steps):
    """preflight (torch-free) refuses a timestep_fraction exactly when grpo_sampler.train_steps
    does, and counts the same steps otherwise."""
    for fraction in (0.01, 0.05, 0.1, 0.29, 0.5, 0.9, 0.95, 0.99, 1.0):
        count = trained_step_count(fraction, steps)
        try:
            assert len(grpo_sampler.train_steps(steps, fraction)) == count
        except ValueError:
            assert not 1 <= count <= steps - 1, (fraction, steps, count)


def test_plan_shows_the_sde_sampler_the_window_and_no_old_policy(tmp_path):
    config = _config(tmp_path, sde_window=2, sample_steps=10, sde_window_range=[0, 5])
    shown = plan.build(config)
    assert shown["sampler"]["scheduler"] == "sde" and shown["sampler"]["noise_level"] == 0.7
    assert "Flow-GRPO-Fast" in shown["sampler"]["variant"] and "0..3" in shown["sampler"]["variant"]
    assert shown["per_step"]["trained_steps_per_sample"] == 2
    assert shown["per_step"]["optimizer_steps"] == 1 and "prompts_per_update" not in shown["per_step"]
    sliced = plan.build(_config(tmp_path, prompts_per_step=4, updates_per_step=2))["per_step"]
    assert sliced["optimizer_steps"] == 2 and sliced["prompts_per_update"] == 2
    assert shown["seed_contract"]["rl.sde_window"] == 2 and shown["seed_contract"]["rl.sde_window_range"] == [0, 5]
    assert not any("old" in item for item in shown["checkpoint"]["contents"])
    assert shown["roles"]["rollout"].startswith("cosmos_rl.trainers.grpo.GRPOTrainer.sample")
    assert plan.build(_config(tmp_path, sample_steps=10))["per_step"]["trained_steps_per_sample"] == 9
    assert "moving_average" not in shown and not any("moving-average" in item for item in shown["checkpoint"]["contents"])
    averaged = plan.build(_config(tmp_path, ema_decay=0.9, ema_every=4))
    assert averaged["moving_average"].startswith("ema = 0.9 x ema + 0.1 x policy every 4 steps")
    assert averaged["model"] == shown["model"] == "built-in preset 'tiny'"
    assert any(item.startswith("moving-average adapter") for item in averaged["checkpoint"]["contents"])


def _adapter(transformer, name: str) -> dict[str, torch.Tensor]:
    """Adapter `name`'s tensors keyed by their place in the network (the adapter's name left out)."""
    out = {}
    for key, param in transformer.named_parameters():
        parts = key.split(".")
        if name in parts and any(p.startswith("lora_") for p in parts):
            parts.remove(name)
            out[".".join(parts)] = param.detach().clone()
    assert out, f"no adapter {name!r}"
    return out


def test_the_moving_average_follows_the_policy_every_n_steps_and_is_the_runs_model(tmp_path, monkeypatch):
    """rl.ema_decay = 0.25, rl.ema_every = 2: the `ema` adapter starts equal to the policy, stays put
    after step 1, and after step 2 is 0.25 x its start + 0.75 x the step-2 policy (worked out here
    from the tensors, not by the trainer's code); the policy alone trains (it moved, the average
    did not by itself). `[rl.eval]` samples with `ema` and hands the policy back; the checkpoint
    holds an `ema` component, and `cosmos-rl eval`'s loader (evaluation.target) reads it into the
    policy adapter: the loaded network's policy is the average, not the trained policy."""
    config = _config(tmp_path, ema_decay=0.25, ema_every=2)
    trainer = local_trainer(config, tmp_path / "run")
    trainer.build(resume=False)
    start_policy, start_ema = _adapter(trainer.transformer, "policy"), _adapter(trainer.transformer, "ema")
    assert start_policy.keys() == start_ema.keys()
    assert all(torch.equal(start_policy[k], start_ema[k]) for k in start_policy)

    trainer.train_step(1)
    after_one = _adapter(trainer.transformer, "ema")
    assert all(torch.equal(after_one[k], start_ema[k]) for k in start_ema)
    trainer.train_step(2)
    policy, ema = _adapter(trainer.transformer, "policy"), _adapter(trainer.transformer, "ema")
    assert any(not torch.equal(policy[k], start_policy[k]) for k in policy)
    for key in ema:
        torch.testing.assert_close(ema[key], 0.25 * start_ema[key] + 0.75 * policy[key], rtol=0, atol=1e-7)
    assert any(not torch.equal(ema[k], policy[k]) for k in ema)

    from cosmos_rl.evaluation import evaluator
    from cosmos_rl.models import lora

    def active(transformer) -> set[str]:
        return {tuple(layer.active_adapters) for _, layer in lora.tuner_layers(transformer)}

    seen = []
    monkeypatch.setattr(evaluator, "evaluate_ranks", lambda ev, transformer, *a: seen.append(active(transformer)) or {})
    trainer.evaluate(2)
    assert seen == [{("ema",)}] and active(trainer.transformer) == {("policy",)}

    trainer.save(2)
    (tmp_path / "run" / "manifest.toml").write_text(load.to_toml(config))  # what `cosmos-rl train` writes
    from cosmos_rl.evaluation.target import open_target

    loaded = open_target(str(tmp_path / "run"), step=2, media=None, out_dir=None).load(torch.device("cpu"))
    got = _adapter(loaded.parts.transformer, "policy")
    assert got.keys() == ema.keys()
    assert all(torch.equal(got[k], ema[k]) for k in ema)


def test_update_slices_split_a_batch_by_hand():
    """rl.updates_per_step's slices: equal, contiguous, in order; a count that does not divide is refused."""
    from cosmos_rl.algorithms.grpo import update_slices

    assert update_slices(32, 2) == [slice(0, 16), slice(16, 32)]
    assert update_slices(6, 3) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert update_slices(4, 1) == [slice(0, 4)]
    for rows, updates in ((6, 4), (4, 0)):
        with pytest.raises(ValueError):
            update_slices(rows, updates)


def test_two_updates_a_step_train_each_slice_once_and_the_second_is_off_policy(tmp_path, monkeypatch):
    """rl.updates_per_step = 2 with 2 prompts a step: every rank's step trains row 0 (both of its
    trained sampler steps), takes an optimizer step, then row 1 with the moved policy, and takes a
    second one (AdamW's step count is 2 after one run step). The first slice is on-policy (its ratio
    is exactly 1); the second is not, so the step's mean ratio leaves 1 and approx_kl is > 0, which
    one update a step never shows (test above)."""
    config = _config(tmp_path, prompts_per_step=2, updates_per_step=2)
    trainer = local_trainer(config, tmp_path / "run")
    trainer.build(resume=False)
    calls = []
    step_loss = trainer._step_loss

    def spy(record, prompt_ids, advantages, measure_kl, actions=None):
        loss, metrics = step_loss(record, prompt_ids, advantages, measure_kl, actions)
        calls.append((record.index, record.x.clone(), float(metrics["ratio_mean"])))
        return loss, metrics

    monkeypatch.setattr(trainer, "_step_loss", spy)
    learn, replays = trainer.learn, []

    def keep_replay(*args, **kwargs):
        replays.append({rank: trainer.replay[rank][1] for rank in trainer.comm.ranks})
        return learn(*args, **kwargs)

    monkeypatch.setattr(trainer, "learn", keep_replay)
    metrics = trainer.train_step(1)
    assert len(calls) == 2 * 2 * 2  # 2 slices x 2 ranks x 2 trained steps, slice by slice
    expected = [(row, rank, j) for row in (0, 1) for rank in (0, 1) for j in (0, 1)]
    for (index, x, _), (row, rank, j) in zip(calls, expected):
        record = replays[0][rank][j]
        assert index == record.index and torch.equal(x, record.x[row:row + 1])
    assert all(ratio == 1.0 for *_, ratio in calls[:4]) and any(ratio != 1.0 for *_, ratio in calls[4:])
    state = trainer.optimizer.state[next(iter(trainer.model.trainable_parameters()))]
    assert int(state["step"]) == 2
    assert metrics["train/ratio_mean"] != 1.0 and metrics["train/approx_kl"] > 0.0


def test_the_moving_average_warms_up_as_flow_grpos_wrapper(tmp_path):
    """rl.ema_warmup with rl.ema_decay = 0.9, rl.ema_every = 1: step 1's update uses decay
    min((1 + 1) / (10 + 1), 0.9) = 2/11 (t = 1 optimizer step taken), so ema = 2/11 x start + 9/11 x
    the step-1 policy (from the tensors, by hand), not 0.9 x start + 0.1 x policy."""
    config = _config(tmp_path, ema_decay=0.9, ema_every=1, ema_warmup=True)
    trainer = local_trainer(config, tmp_path / "run")
    trainer.build(resume=False)
    start = _adapter(trainer.transformer, "ema")
    trainer.train_step(1)
    policy, ema = _adapter(trainer.transformer, "policy"), _adapter(trainer.transformer, "ema")
    assert any(not torch.equal(policy[k], start[k]) for k in policy)
    for key in ema:
        torch.testing.assert_close(ema[key], (2 / 11) * start[key] + (9 / 11) * policy[key], rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    ("rl", "lora_rank", "key", "severity"),
    [
        ({"ema_decay": 1.0}, 4, "rl.ema_decay", "error"),
        ({"ema_decay": -0.1}, 4, "rl.ema_decay", "error"),
        ({"ema_decay": 0.9, "ema_every": 0}, 4, "rl.ema_every", "error"),
        ({"ema_decay": 0.9}, 0, "rl.ema_decay", "error"),  # a full fine-tune has no adapter to average into
        ({"ema_every": 4}, 4, "rl.ema_every", "warning"),  # no moving average: the cadence does nothing
        ({"ema_warmup": True}, 4, "rl.ema_warmup", "warning"),  # nor its warm-up
        ({"clip_range_high": 0.0}, 4, "rl.clip_range_high", "error"),
        ({"updates_per_step": 0}, 4, "rl.updates_per_step", "error"),
        ({"prompts_per_step": 3, "updates_per_step": 2}, 4, "rl.updates_per_step", "error"),  # slices must be equal
    ],
)
def test_preflight_judges_the_moving_average_and_the_updates_a_step(tmp_path, rl, lora_rank, key, severity):
    raw = {**RAW, "job": {**RAW["job"], "output_dir": str(tmp_path)}, "rl": {**RAW["rl"], **rl},
           "model": {**RAW["model"], "lora": {"rank": lora_rank, "alpha": 8.0}}}  # fmt: skip
    found = [(p.path, p.severity) for p in preflight.check(load.structure(raw))]
    assert (key, severity) in found, found
    assert [p for p in found if p[1] == "error"] == ([(key, "error")] if severity == "error" else [])
