"""The conditioning first frame of every prompt row of an image-to-video NFT run (`rl.first_frame`).

Built with the run's prompts, so a bad row stops the run before step 1, naming ``file:line``:
`image` rows are each opened and checked (header and size, `data.first_frame_files`; pixels are
decoded when the row is first sampled), `shapes_world` captions each read by the suite whose given
first frames that source is (`config.run_suite.FIRST_FRAME_SUITES`: `shapes_video`). A row's frame is then encoded once (`models.generate.condition_latents`) and kept: the same clean
latent frame every time the row is drawn, on every rank. Nothing here draws a random number, so
the seed contract (and `resume --exact`) is that of a text-to-video run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cosmos_rl.data import first_frame_files
from cosmos_rl.data.prompt_file import PromptRow, read_prompt_rows
from cosmos_rl.core.errors import UserError
from cosmos_rl.config.run_suite import FIRST_FRAME_SUITES
from cosmos_rl.suites import registry as suites


class FirstFrames:
    """Row index (in prompt-file order, as `data.prompts.run_prompts` lists them) -> its conditioning frame."""

    def __init__(self, source: str, prompt_file: str, media):
        self.source, self.media = source, media
        self.path = Path(prompt_file)
        rows, problems = read_prompt_rows(self.path)
        if problems:
            raise problems[0]
        self.rows: list[PromptRow] = rows
        height, width = media.height, media.width
        self.suite = suites.get(FIRST_FRAME_SUITES[source]) if source != "image" else None
        for row in rows:
            origin = f"{self.path}:{row.line}"
            if source == "image":
                if row.image is None:
                    raise first_frame_files.missing(self.path, row.line)
                first_frame_files.check_first_frame(row.image, origin, height, width)
            else:
                try:
                    self.suite.task_of(row.prompt)
                except ValueError as exc:
                    raise UserError(f'{origin}: rl.first_frame = "{source}" needs a {self.suite.title} video caption ({exc}); '
                                    f"use prompts from {self.suite.prompt_source}") from None  # fmt: skip
        self._latents: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def frame(self, row: int) -> np.ndarray:
        """uint8 [H, W, 3] first frame of prompt row `row`."""
        entry, media = self.rows[row], self.media
        if self.source == "image":
            return first_frame_files.read_first_frame(entry.image, f"{self.path}:{entry.line}", media.height, media.width)
        # The suite's own given frame: the one its I2V rewards judge frame 0 against.
        return self.suite.given_frames([entry.prompt], media)[0]

    def latents(self, vae: torch.nn.Module, rows: list[int], device: torch.device) -> torch.Tensor:
        """Clean latents [len(rows), C, 1, h, w] of the rows' frames (each row encoded once)."""
        from cosmos_rl.models.generate import condition_latents

        for row in rows:
            if row not in self._latents:
                frame = torch.from_numpy(self.frame(row))[None].to(device)
                self._latents[row] = condition_latents(vae, frame)[0]
        return torch.stack([self._latents[row] for row in rows])
