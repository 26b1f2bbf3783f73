"""An episode of a robot (or a simulated agent) as one value: what a world model's conditioned
samples are cut from, whatever stored it (a LeRobot-format dataset, `data/lerobot.py`) or made it
(a world's planner, `pusht/`).

LeRobot's convention: row t holds observation t (frame t, the state at t) and the action taken at
t, which observation t + 1 shows the effect of. A window of `chunk + 1` frames starting at `start`
therefore goes with the `chunk` actions `start .. start + chunk - 1` (Cosmos3's action runs: one
row per transition between frames).
"""

from __future__ import annotations

import attrs
import numpy as np


@attrs.frozen(eq=False)
class Episode:
    index: int  # the episode's index in its dataset (LeRobot's `episode_index`)
    frames: np.ndarray  # uint8 [T, H, W, 3]: the camera's frames
    actions: np.ndarray  # float32 [T, A]: the raw action taken at each frame, in the embodiment's units
    states: np.ndarray  # float64 [T, S]: the world's state at each frame as the world defines it; S = 0 when not recorded
    task: str  # the instruction in words (LeRobot's task)
    fps: float  # frames per second of the recording

    def __attrs_post_init__(self):
        t = len(self.frames)
        if self.frames.ndim != 4 or self.frames.shape[-1] != 3 or self.frames.dtype != np.uint8:
            raise ValueError(f"episode {self.index}: frames must be uint8 [T, H, W, 3], found {self.frames.dtype} {self.frames.shape}")
        if self.actions.ndim != 2 or len(self.actions) != t:
            raise ValueError(f"episode {self.index}: actions must be [T={t}, A], found {self.actions.shape}")
        if self.states.ndim != 2 or len(self.states) != t:
            raise ValueError(f"episode {self.index}: states must be [T={t}, S], found {self.states.shape}")

    @property
    def length(self) -> int:
        return len(self.frames)

    def windows(self, chunk: int) -> range:
        """The start frames of every whole window of `chunk + 1` frames, in order."""
        return range(0, max(0, self.length - chunk))

    def window(self, start: int, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(frames [chunk + 1, H, W, 3], actions [chunk, A], states [chunk + 1, S]) from `start`."""
        if start < 0 or start + chunk >= self.length:
            raise ValueError(f"episode {self.index}: a window of {chunk + 1} frames at frame {start} runs past its {self.length} frames")
        end = start + chunk + 1
        return self.frames[start:end], self.actions[start : end - 1], self.states[start:end]


@attrs.frozen(eq=False)
class EpisodeWindow:
    """One held-out window of an episode: `chunk + 1` frames from `start`, the episode it is cut from
    (a verifier that replays the world from the episode's first state needs the actions before
    it), and the `task` it counts under in an evaluation (its group for the bootstrap, e.g. the
    episode maker: "planner", "random")."""

    episode: Episode
    start: int
    chunk: int
    task: str

    def __attrs_post_init__(self):
        self.episode.window(self.start, self.chunk)  # refuses a window past the episode's end

    @property
    def frames(self) -> np.ndarray:
        return self.episode.window(self.start, self.chunk)[0]

    @property
    def actions(self) -> np.ndarray:
        return self.episode.window(self.start, self.chunk)[1]

    @property
    def states(self) -> np.ndarray:
        return self.episode.window(self.start, self.chunk)[2]

    @property
    def lead_in(self) -> np.ndarray:
        """The actions the episode took before the window (replaying them from its first state
        reaches the window's first state exactly)."""
        return self.episode.actions[: self.start]

    @property
    def caption(self) -> str:
        return self.episode.task

    @property
    def label(self) -> str:
        """For sheets and messages: "episode 3, frames 10-18"."""
        return f"episode {self.episode.index}, frames {self.start}-{self.start + self.chunk}"
