"""The shapes world: procedural prompts and images with an exact, weight-free verifier.

Public API (see docs/shapes.md):

- prompts: :func:`split_prompts` (train / held-out specs by task), :func:`all_specs`,
  :func:`balanced`, :func:`parse_caption`, :func:`task_of`, :class:`Spec`, :class:`Group`,
  :data:`TASKS`;
- images: :func:`render`;
- scores: :func:`verify` (one :class:`Verdict` per image), :func:`shapes_strict`,
  :func:`shapes_partial` (the built-in rewards), :func:`scores_by_task`, :func:`overall_score`;
- files: :func:`write_prompt_file`, :func:`write_shards`;
- video (the moving-shapes world, docs/shapes.md): :func:`split_motion_prompts`,
  :func:`all_motion_specs`, :func:`parse_motion_caption`, :class:`MotionSpec`, :data:`MOTION_TASKS`,
  :func:`render_clip`, :func:`verify_clips`, :func:`score_clips`, :func:`frame_captions`,
  :func:`motion_scores_by_task`.

Both worlds share one core: the phrase grammar (`caption`), the renderer (`scene`), the object
finder (`analyse`), the verdict (`verifier`) and prompts by task (`tasks`: the split on meanings,
the task-balanced draw, per-task means).

The shipped `shapes` model preset builds on `cosmos_rl.models` and is not imported here:
`cosmos_rl.models.shapes_preset` (architecture and loader), `cosmos_rl.models.shapes_held_out`
(its held-out scorer) and `cosmos_rl.commands.base_build` (`python -m cosmos_rl.commands.base_build
build`, the SFT command that makes it).
"""

from cosmos_rl.shapes.caption import CaptionError, parse_caption, task_of
from cosmos_rl.shapes.clips import render_clip
from cosmos_rl.shapes.motion_caption import parse_motion_caption
from cosmos_rl.shapes.motion_spec import MOTION_TASKS, MotionSpec
from cosmos_rl.shapes.motion_verifier import frame_captions, motion_scores_by_task, score_clips, verify_clips
from cosmos_rl.shapes.motion_world import all_motion_specs, split_motion_prompts
from cosmos_rl.shapes.prompt_files import write_prompt_file
from cosmos_rl.shapes.scene import render
from cosmos_rl.shapes.shards import write_shards
from cosmos_rl.shapes.spec import TASKS, Group, Spec
from cosmos_rl.shapes.verifier import Verdict, overall_score, scores_by_task, shapes_partial, shapes_strict, verify
from cosmos_rl.shapes.world import PromptSplit, all_specs, balanced, split_prompts

__all__ = [
    "TASKS", "CaptionError", "Group", "PromptSplit", "Spec", "Verdict", "all_specs", "balanced",
    "overall_score", "parse_caption", "render", "scores_by_task", "shapes_partial", "shapes_strict",
    "split_prompts", "task_of", "verify", "write_prompt_file", "write_shards",
    # video
    "MOTION_TASKS", "MotionSpec", "all_motion_specs", "frame_captions", "motion_scores_by_task",
    "parse_motion_caption", "render_clip", "score_clips", "split_motion_prompts", "verify_clips",
]
