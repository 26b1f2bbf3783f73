"""Action rows through the model, exactly as `Cosmos3OmniPipeline` runs an action condition.

An action-conditioned sample is its prompt, its clip's latents and `rows` action tokens (one per
transition, `chunk` of them), each a row of the transformer's `action_dim` columns: the
embodiment's raw (normalised) action in the first `width` columns, zeros after. In the packed
sequence a sample's generation block is its vision tokens followed by its action tokens; action
token i sits at the time of pixel frame i + 1 (the pipeline's `_prepare_action_segment`), is
projected in and out by its embodiment's weights (`action_domain_ids`), and, when noisy, gets the
same timestep embedding as the noisy frames. Clean rows (forward dynamics: all of them) get no
timestep and no prediction; their velocity is 0, and so is every padding column's (the pipeline's
`_mask_velocity_predictions`).

Here: the per-sample layout of the rows (`ActionLayout`), building the rows a generation starts from
(`model_rows`, `start_rows`), the transformer's action keywords for a packed forward
(`action_inputs`, used by `packing.packed_inputs`) and the velocity read back (`action_velocity`),
holding clean rows and padding through the sampler (`hold_rows`), and the pipeline's structured
caption as token ids (`action_prompt_ids`).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from cosmos_rl.core.actions import ActionSpec
from cosmos_rl.core.media import MediaSpec


class ActionLayout(NamedTuple):
    """What stays fixed about each sample's action rows for a whole generation: `rows` per sample
    (the chunk), and per sample its embodiment's `domain_ids`, raw `widths` and leading
    `clean_rows` (held clean: all `rows` for forward dynamics, 0 when actions are generated)."""

    rows: int
    domain_ids: tuple[int, ...]
    widths: tuple[int, ...]
    clean_rows: tuple[int, ...]

    @classmethod
    def of(cls, spec: ActionSpec, batch: int) -> "ActionLayout":
        """Every one of `batch` samples under `spec`."""
        return cls(spec.chunk, (spec.domain_id,) * batch, (spec.width,) * batch, (spec.clean_rows,) * batch)

    @property
    def batch(self) -> int:
        return len(self.domain_ids)

    @property
    def any_noisy(self) -> bool:
        """Whether some sample generates action rows (else the sampler never steps them)."""
        return any(clean < self.rows for clean in self.clean_rows)

    def take(self, order: Sequence[int]) -> "ActionLayout":
        """The samples at `order`, in that order."""
        pick = lambda values: tuple(values[i] for i in order)  # noqa: E731
        return ActionLayout(self.rows, pick(self.domain_ids), pick(self.widths), pick(self.clean_rows))

    def twice(self) -> "ActionLayout":
        """The batch followed by itself (a guided step's conditional and unconditional halves)."""
        return ActionLayout(self.rows, self.domain_ids * 2, self.widths * 2, self.clean_rows * 2)

    def check(self, config, rows: torch.Tensor | None = None) -> None:
        """Raise unless the transformer (`config`) takes these rows: action heads, enough columns,
        a projection per domain; and `rows` [B, rows, action_dim] (when given) fits the layout."""
        if not getattr(config, "action_gen", False):
            raise ValueError("action rows need a transformer built with action_gen=True (its action heads); this one has none")
        if not (len(self.domain_ids) == len(self.widths) == len(self.clean_rows)) or self.rows < 1:
            raise ValueError(f"action layout needs rows >= 1 and one domain, width, clean count per sample: {self}")
        action_dim, domains = int(config.action_dim), int(config.num_embodiment_domains)
        for index, (domain, width, clean) in enumerate(zip(self.domain_ids, self.widths, self.clean_rows)):
            if not 0 <= domain < domains:
                raise ValueError(f"sample {index}: action domain id {domain} is not below the model's num_embodiment_domains {domains}")
            if not 1 <= width <= action_dim:
                raise ValueError(f"sample {index}: action width {width} does not fit the model's action_dim {action_dim}")
            if not 0 <= clean <= self.rows:
                raise ValueError(f"sample {index}: {clean} clean action rows of {self.rows}")
        if rows is not None and tuple(rows.shape) != (self.batch, self.rows, action_dim):
            raise ValueError(
                f"action rows must be [B, rows, action_dim] = [{self.batch}, {self.rows}, {action_dim}], got {tuple(rows.shape)}"
            )


def chunk_rows(raw: torch.Tensor, chunk: int) -> torch.Tensor:
    """The pipeline's fit of a forward-dynamics action sequence [T, width] to `chunk` rows: a
    shorter one repeats its last action, a longer one is cut."""
    if raw.dim() != 2 or raw.shape[0] < 1:
        raise ValueError(f"raw actions must be [T >= 1, width], got {tuple(raw.shape)}")
    if raw.shape[0] < chunk:
        raw = torch.cat([raw, raw[-1:].expand(chunk - raw.shape[0], -1)])
    return raw[:chunk]


def model_rows(spec: ActionSpec, raw: torch.Tensor, action_dim: int) -> torch.Tensor:
    """Raw actions [B, chunk, width] -> the model's rows [B, chunk, action_dim]: normalised by
    `spec`, zero-padded to `action_dim` (the pipeline pads raw actions the same way)."""
    if raw.dim() != 3 or tuple(raw.shape[1:]) != (spec.chunk, spec.width):
        raise ValueError(
            f"{spec.embodiment} actions must be [B, chunk, width] = [B, {spec.chunk}, {spec.width}], got {tuple(raw.shape)}"
        )
    if spec.width > action_dim:
        raise ValueError(f"{spec.embodiment} actions have {spec.width} columns, the model's action_dim is {action_dim}")
    rows = raw
    if spec.offset is not None:
        offset = torch.tensor(spec.offset, dtype=raw.dtype, device=raw.device)
        scale = torch.tensor(spec.scale, dtype=raw.dtype, device=raw.device)
        rows = (raw - offset) / scale
    return torch.cat([rows, rows.new_zeros(*rows.shape[:2], action_dim - spec.width)], dim=-1)


def raw_actions(spec: ActionSpec, rows: torch.Tensor) -> torch.Tensor:
    """The model's rows [B, chunk, action_dim] -> raw actions [B, chunk, width] (undoes `model_rows`)."""
    values = rows[..., : spec.width]
    if spec.offset is None:
        return values
    offset = torch.tensor(spec.offset, dtype=rows.dtype, device=rows.device)
    scale = torch.tensor(spec.scale, dtype=rows.dtype, device=rows.device)
    return values * scale + offset


def start_rows(noise: torch.Tensor, clean: torch.Tensor | None, layout: ActionLayout) -> torch.Tensor:
    """The rows a generation starts from, as the pipeline's `prepare_latents` builds them: each
    sample's leading `clean_rows` from `clean`, the rest from `noise` (both [B, rows, action_dim]),
    every column past the sample's width zero."""
    if clean is None:
        if any(layout.clean_rows):
            raise ValueError(f"{layout.clean_rows} clean action rows per sample need their clean values")
        clean = torch.zeros_like(noise)
    if clean.shape != noise.shape:
        raise ValueError(f"clean rows {tuple(clean.shape)} and noise {tuple(noise.shape)} differ in shape")
    return hold_rows(noise.clone(), clean, layout)


def hold_rows(rows: torch.Tensor, start: torch.Tensor, layout: ActionLayout) -> torch.Tensor:
    """`rows` with each sample's clean rows written back from `start` and its padding columns zeroed
    (in place; returned). After every sampler step, as the pipeline keeps them: it never steps a
    clean row and zeroes the padding after each step."""
    for index, (width, clean) in enumerate(zip(layout.widths, layout.clean_rows)):
        rows[index, :clean] = start[index, :clean]
        rows[index, :, width:] = 0
    return rows


def action_inputs(
    rows: torch.Tensor, layout: ActionLayout, block_starts: torch.Tensor, timesteps: torch.Tensor
) -> dict:
    """The transformer's action keywords for a packed forward: sample b's rows sit at sequence
    positions `block_starts[b]` + 0..rows-1; each noisy row gets `timesteps[b]` (the integer the
    noisy frames get)."""
    device = rows.device
    offsets = torch.arange(layout.rows, device=device)
    sequence = (block_starts.to(device)[:, None] + offsets).flatten()
    noisy = [torch.arange(clean, layout.rows, device=device) for clean in layout.clean_rows]
    predicted = torch.cat([sequence.view(layout.batch, layout.rows)[b, clean:] for b, clean in enumerate(layout.clean_rows)])
    counts = torch.tensor([layout.rows - clean for clean in layout.clean_rows], device=device)
    return dict(
        action_tokens=[sample for sample in rows],  # [rows, action_dim] each
        action_token_shapes=[(layout.rows, 1, 1)] * layout.batch,
        action_sequence_indexes=sequence,
        action_mse_loss_indexes=predicted,
        action_timesteps=timesteps.repeat_interleave(counts),
        action_noisy_frame_indexes=noisy,
        action_domain_ids=[torch.tensor([domain], dtype=torch.long, device=device) for domain in layout.domain_ids],
    )


def action_velocity(predictions: list[torch.Tensor], layout: ActionLayout) -> torch.Tensor:
    """The transformer's per-sample action predictions ([rows, action_dim], zero at clean rows) ->
    [B, rows, action_dim] with every padding column zero (the pipeline masks them likewise)."""
    velocity = torch.stack(predictions)
    for index, width in enumerate(layout.widths):
        velocity[index, :, width:] = 0
    return velocity


def action_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    template: str,
    descriptions: list[str],
    spec: ActionSpec,
    media: MediaSpec,
    *,
    negative_prompt: str = "",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(cond, uncond) ids per description for an action run over a clip of `media`.

    `chat`: as `Cosmos3OmniPipeline.tokenize_prompt(action_mode=...)` builds them: the video system
    prompt, the structured caption (`ActionSpec.caption`, naming `media`'s frame count, fps and
    size) as the user turn, the negative prompt as it is (no sentences appended); EOS and
    `<|vision_start|>` end both. `minimal`: the description's bytes (see `text.model_prompt_ids`)."""
    from cosmos_rl.models.text import chat_ids, model_prompt_ids

    if isinstance(descriptions, str):
        raise TypeError("descriptions must be a list of strings, got a single string")
    if media.frames != spec.frames:
        raise ValueError(f"an action chunk of {spec.chunk} spans {spec.frames} frames, the media has {media.frames}")
    if template != "chat":
        return model_prompt_ids(tokenizer, template, descriptions, media)
    uncond = torch.tensor(chat_ids(tokenizer, negative_prompt, media=media), dtype=torch.long)
    cond = [torch.tensor(chat_ids(tokenizer, spec.caption(text, media), media=media), dtype=torch.long) for text in descriptions]
    return cond, [uncond.clone() for _ in descriptions]
