"""What makes two held-out evaluations one measurement: a run's base and its in-training `[rl.eval]`,
and whether an `eval.json` of `cosmos-rl eval` was measured as that `[rl.eval]` measures (the same
prompts, seeds, reward, sampler and image size), so its numbers sit on the run's eval/score curve.
`compare` (`--base-eval`) and `report` (the base's line on the eval curve) judge it alike."""

from __future__ import annotations


def base_of(config) -> dict:
    """What a run starts from: the architecture (preset or folder), the base weights and the media."""
    from cosmos_rl.core.media import MediaSpec

    model, weights = config.model, config.rl.init_from
    architecture = f"preset:{model.preset}" if model.preset else model.path
    if not weights or weights == model.path:
        weights = architecture  # "" = model.* 's own weights
    media = MediaSpec.from_model_config(model)
    return {"model": architecture, "init_from": weights, "frames": media.frames, "size": media.size_json()}


def held_out_of(config) -> dict | None:
    """The in-training held-out evaluation of a run ([rl.eval], its sampler resolved); None without one."""
    from cosmos_rl.config.run_suite import run_suite
    from cosmos_rl.config.sampler import run_settings

    e = config.rl.eval
    if e.every <= 0:
        return None
    settings = run_settings(config)
    return {
        "prompts": e.prompts, "per_task": e.per_task, "seeds": e.seeds, "reward": e.reward,  # prompts "": the held-out default
        "sample_steps": settings.steps, "sampler_shift": settings.shift, "guidance": settings.guidance,
        "suite": run_suite(config).name,  # whose held-out prompts and verifier
    }  # fmt: skip


def differences(result: dict, held_out: dict, base: dict, whose: str = "the run's") -> list[str]:
    """What differs between how the eval.json `result` was measured and the `held_out` [rl.eval]
    (`held_out_of`) of a run on `base` (`base_of`), one `what: found, expected` line each; empty
    when they are one measurement."""
    from cosmos_rl.evaluation.prompts import eval_captions
    from cosmos_rl.suites import registry as suites

    captions, described = eval_captions(held_out["prompts"] or None, held_out["per_task"], suites.get(held_out["suite"]))
    sampler = result.get("sampler") if isinstance(result.get("sampler"), dict) else {}
    expected = {
        "prompts": described, "n_prompts": len(captions), "seeds": list(range(held_out["seeds"])), "reward": held_out["reward"],
        "sampler steps": held_out["sample_steps"], "sampler guidance": held_out["guidance"], "image_size": base["size"],
    }  # fmt: skip
    found = {**{k: result.get(k) for k in ("prompts", "n_prompts", "seeds", "reward", "image_size")},
             "sampler steps": sampler.get("steps"), "sampler guidance": sampler.get("guidance")}  # fmt: skip
    if held_out["sampler_shift"] is not None:  # unset: the model's own, which eval.json records resolved
        expected["sampler shift"], found["sampler shift"] = held_out["sampler_shift"], sampler.get("shift")
    return [f"{k}: {found[k]!r}, {whose} [rl.eval] {expected[k]!r}" for k in expected if found[k] != expected[k]]
