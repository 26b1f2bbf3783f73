"""Diffusion-DPO on a world model's predicted futures in forward dynamics (docs/world_training.md "DPO in
forward dynamics"): what each pair is conditioned on, rebuilt from its key.

A pair's `prompt` is a training-window key of an episode suite (`[model.condition] source`, e.g.
`pusht`; `cosmos-rl pairs mine --reward pusht_forward_partial` writes such pairs). Winner and
loser are two futures of the same window, so they share its conditioning: frame 0 of the window,
encoded once per key as the clean latent frame 0 (`models.generate.condition_latents`, as the
mined clips were sampled from it and as NFT's rollouts are given it), and the window's true
action rows (normalised by `[model.action]`, zero-padded to the transformer's `action_dim`), held
clean in the packed forward. The text is the pipeline's structured action caption of the window's
task. Both are inputs only: the DPO MSEs are taken over the generated latent frames (after frame
0), and the action velocity the forward returns is dropped, so no gradient reaches either.

Every pair's key is checked when the run starts (`check`), from the source's metadata alone,
naming the pair's row and the fix.
"""

from __future__ import annotations

import numpy as np
import torch

from cosmos_rl.core.condition import Condition
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.suites import registry as suites


class PairWindows:
    """Key -> its window's clean frame-0 latent, action rows and caption ids (each built once)."""

    def __init__(self, condition: Condition, media: MediaSpec, model, device: torch.device):
        if condition.action is None or condition.action.mode != "forward_dynamics":
            raise UserError(f"model.condition.kind = {condition.kind.name!r}: DPO trains the world model in forward_dynamics in this release")
        self.condition, self.media, self.model, self.device = condition, media, model, device
        self.spec = condition.action
        try:
            self.suite = suites.get(condition.source)
        except suites.UnknownSuite as exc:
            raise UserError(f"model.condition.source: {exc}") from None
        if not self.suite.keys_windows:
            raise UserError(f"model.condition.source = {condition.source!r}: DPO in forward dynamics reads pairs whose prompts are an "
                            "episode suite's training-window keys, and this suite keys none; use \"pusht\"")  # fmt: skip
        from cosmos_rl.models.actions import ActionLayout

        try:
            ActionLayout.of(self.spec, 1).check(model.transformer.config)
        except ValueError as exc:
            raise UserError(f"model.path: {exc}; use a Cosmos3 folder built with action_gen = true (Cosmos3-Nano has them)") from None
        self.clean = condition.clean_latent_frames(media, _temporal_factor(model.vae.config))  # latent frames held clean: 1
        self._windows: dict[str, object] = {}
        self._latents: dict[str, torch.Tensor] = {}
        self._ids: dict[str, torch.Tensor] = {}

    def check(self, source, what: str) -> None:
        """Every pair's prompt is a key of the suite that fits the run's clips; else a UserError naming its row."""
        sides = getattr(source, "prompt_sides", None)
        if sides is None:  # generated pairs (synthetic): captions, never keys (preflight refuses them)
            raise UserError(f"{what}.synthetic_pairs: generated pairs have captions, and DPO in forward dynamics reads pairs of "
                            f"{self.suite.title} window keys; mine them with cosmos-rl pairs mine --reward "
                            f"{self.suite.rewards[0].name} and set {what}.shards")  # fmt: skip
        for row in sides():
            try:
                self.suite.window(row.prompt, self.media, check_only=True)
            except ValueError as exc:
                raise UserError(f"{row.origin} (id {row.id!r}): model.condition.source = {self.suite.name!r} trains on pairs whose prompt is a "
                                f"{self.suite.title} training-window key ({exc}); use pairs mined with cosmos-rl pairs mine --reward "
                                f"{self.suite.rewards[0].name}, or remove [model.condition]") from None  # fmt: skip

    def window(self, key: str):
        if key not in self._windows:
            self._windows[key] = self.suite.window(key, self.media)
        return self._windows[key]

    def frame_latents(self, keys: list[str]) -> torch.Tensor:
        """Clean latents [len(keys), C, clean, h, w] of each key's frame 0 (encoded once per key)."""
        from cosmos_rl.models.generate import condition_latents

        for key in keys:
            if key not in self._latents:
                frame = torch.from_numpy(self.window(key).frames[:1]).to(self.device)
                with torch.no_grad():
                    self._latents[key] = condition_latents(self.model.vae, frame)[0]
        return torch.stack([self._latents[key] for key in keys])

    def action_inputs(self, keys: list[str]) -> dict:
        """`actions=` and `action_layout=` of the keys' true action rows, every row clean."""
        from cosmos_rl.models.actions import ActionLayout, model_rows, start_rows

        raw = torch.from_numpy(np.stack([self.window(key).actions for key in keys]).astype(np.float32)).to(self.device)
        rows = model_rows(self.spec, raw, int(self.model.transformer.config.action_dim))
        layout = ActionLayout.of(self.spec, len(keys))
        assert all(clean == layout.rows for clean in layout.clean_rows), "forward dynamics holds every action row clean"
        return {"actions": start_rows(torch.zeros_like(rows), rows, layout), "action_layout": layout}

    def prompt_ids(self, key: str) -> torch.Tensor:
        """The pipeline's structured action caption of the key's window task, as token ids."""
        caption = self.window(key).caption
        if caption not in self._ids:
            from cosmos_rl.models.actions import action_prompt_ids

            cond, _ = action_prompt_ids(self.model.tokenizer, self.model.parts.prompt_template, [caption], self.spec, self.media)
            self._ids[caption] = cond[0].to(self.device)
        return self._ids[caption]


def _temporal_factor(vae_config) -> int:
    from cosmos_rl.core.media import vae_temporal_factor

    return vae_temporal_factor(vae_config)
