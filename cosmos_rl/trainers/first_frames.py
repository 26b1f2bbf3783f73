"""The given frames of every prompt row of a conditioned online run (`[model.condition]`, e.g. I2V NFT).

Built with the run's prompts, so a bad row stops the run before step 1, naming ``file:line``:
with source `image` each row's image is opened and checked (header and size,
`data.first_frame_files`; pixels are decoded when the row is first sampled); with a suite as the
source each caption is read by that suite (`suites.registry`), whose ground truth gives the
frames. A world-model run (an action mode, `[model.condition] source` an episode suite that keys
its training windows, e.g. `pusht`) has a window key per row (`suites/base.py`): the key is
checked at build, its window built on first draw (the last `KEPT_WINDOWS` kept), and the row gives frame 0 of the window, its
true action rows (`action_rows`) and its task as the description of the structured caption
(`caption`); the key itself stays the row's prompt, so it travels with every rollout to the
rewards, which rebuild the window from it. A row's frames are then encoded once (`models.generate.condition_latents`) and kept: the
same clean latent frames every time the row is drawn, on every rank. Nothing here draws a random
number, so the seed contract (and `resume --exact`) is that of an unconditioned run.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from cosmos_rl.core.condition import Condition
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data import first_frame_files
from cosmos_rl.data.prompt_file import PromptRow, read_prompt_rows
from cosmos_rl.models.generate import condition_latents
from cosmos_rl.suites import registry as suites


KEPT_WINDOWS = 256  # keyed windows kept per process; an evicted one is rebuilt from its key (the suites keep episodes too)


class FirstFrames:
    """Row index (in prompt-file order, as `data.prompts.run_prompts` lists them) -> its given frames."""

    def __init__(self, condition: Condition, prompt_file: str, media: MediaSpec):
        if condition.source == "image" and condition.kind.given_frames != 1:
            raise UserError(f'model.condition.source = "image": a prompt row\'s image is one frame, and condition '
                            f"{condition.kind.name!r} gives {condition.kind.given_frames}; use a suite as the source")
        self.condition, self.media = condition, media
        self.source = condition.source
        self.count = condition.kind.given_frames
        self.path = Path(prompt_file)
        rows, problems = read_prompt_rows(self.path)
        if problems:
            raise problems[0]
        self.rows: list[PromptRow] = rows
        height, width = media.height, media.width
        self.suite = suites.get(self.source) if self.source != "image" else None
        self.keyed = self.suite is not None and self.suite.keys_windows
        if condition.has_actions != self.keyed:
            raise UserError(f'model.condition.source = "{self.source}": an online run of an action mode takes its windows from an episode '
                            "suite that keys its training windows (e.g. \"pusht\"), and only such a run does")  # fmt: skip
        self._windows: OrderedDict[int, object] = OrderedDict()  # the last KEPT_WINDOWS drawn (a window holds its episode)
        for row in rows:
            origin = f"{self.path}:{row.line}"
            if self.keyed:
                try:
                    self.suite.window(row.prompt, media, check_only=True)
                except ValueError as exc:
                    raise UserError(f'{origin}: model.condition.source = "{self.source}": {exc}; each row is a {self.suite.title} '
                                    f"window key: write them with {self.suite.prompt_source.split(' (')[0]}") from None  # fmt: skip
            elif self.source == "image":
                if row.image is None:
                    raise first_frame_files.missing(self.path, row.line)
                first_frame_files.check_first_frame(row.image, origin, height, width)
            else:
                try:
                    self.suite.task_of(row.prompt)
                except ValueError as exc:
                    raise UserError(f'{origin}: model.condition.source = "{self.source}" needs a {self.suite.title} video caption ({exc}); '
                                    f"use prompts from {self.suite.prompt_source}") from None  # fmt: skip
        self._latents: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def frame(self, row: int) -> np.ndarray:
        """uint8 [H, W, 3] first frame of prompt row `row`."""
        return self.given(row)[0]

    def window(self, row: int):
        """The `EpisodeWindow` a keyed row names (built on its first draw, then kept)."""
        if row in self._windows:
            self._windows.move_to_end(row)
        else:
            entry = self.rows[row]
            try:
                window = self.suite.window(entry.prompt, self.media)
            except ValueError as exc:  # a dataset's episode that cannot be decoded: named like a bad key
                raise UserError(f"{self.path}:{entry.line}: {exc}; fix or drop the row") from None
            width = self.condition.action.width
            if window.actions.shape[1] != width:  # a dataset of another robot's actions (a simulated suite's are its own)
                raise UserError(f"{self.path}:{entry.line}: the window's actions are {window.actions.shape[1]} wide, "
                                f"{self.condition.action.embodiment}'s are {width}; check model.action.embodiment")  # fmt: skip
            self._windows[row] = window
            while len(self._windows) > KEPT_WINDOWS:  # a dataset's thousands of rows would otherwise keep every decoded episode
                self._windows.popitem(last=False)
        return self._windows[row]

    def caption(self, row: int) -> str:
        """The description of row `row`'s structured action caption: its window's task."""
        return self.window(row).caption

    def action_rows(self, rows: list[int], action_dim: int, device: torch.device) -> torch.Tensor:
        """float32 [len(rows), chunk, action_dim]: the rows' true actions as the model's normalised rows
        (`[model.action]`'s offset and scale, zero-padded to the transformer's `action_dim`)."""
        from cosmos_rl.models.actions import model_rows

        raw = torch.from_numpy(np.stack([self.window(row).actions for row in rows]).astype(np.float32)).to(device)
        return model_rows(self.condition.action, raw, action_dim)

    def given(self, row: int) -> np.ndarray:
        """uint8 [k, H, W, 3]: the given leading frames of prompt row `row`."""
        entry, media = self.rows[row], self.media
        if self.keyed:
            return self.window(row).frames[: self.count]
        if self.source == "image":
            return first_frame_files.read_first_frame(entry.image, f"{self.path}:{entry.line}", media.height, media.width)[None]
        if self.count == 1:
            # The suite's own given frame: the one its I2V rewards judge frame 0 against.
            return self.suite.given_frames([entry.prompt], media)
        # k > 1 leading frames: suites give first frames, so these are the shapes worlds' ground
        # truth at the seed the suites' first frames use (a suite-level source is the world-model work's).
        from cosmos_rl.shapes.clips import render_clip
        from cosmos_rl.shapes.first_frame_check import WORLD_SEED

        return render_clip(entry.prompt, WORLD_SEED, media.size, media.frames)[: self.count]

    def latents(self, vae: torch.nn.Module, rows: list[int], device: torch.device) -> torch.Tensor:
        """Clean latents [len(rows), C, k', h, w] of the rows' given frames (each row encoded once)."""
        for row in rows:
            if row not in self._latents:
                given = torch.from_numpy(self.given(row))
                # one frame as image to video encodes it ([1, H, W, 3]); k frames as a clip's start
                frames = given[:1] if self.count == 1 else given[None]
                self._latents[row] = condition_latents(vae, frames.to(device))[0]
        return torch.stack([self._latents[row] for row in rows])
