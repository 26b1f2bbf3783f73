"""The shapes world: procedural prompts and images with an exact, weight-free verifier.

Public API (see docs/eval.md):

- prompts: :func:`split_prompts` (train / held-out specs by task), :func:`all_specs`,
  :func:`balanced`, :func:`parse_caption`, :func:`task_of`, :class:`Spec`, :class:`Group`,
  :data:`TASKS`;
- images: :func:`render`;
- scores: :func:`verify` (one :class:`Verdict` per image), :func:`shapes_strict`,
  :func:`shapes_partial` (the built-in rewards), :func:`scores_by_task`, :func:`overall_score`;
- files: :func:`write_prompt_file`, :func:`write_shards`.

The shipped `shapes` model preset builds on `cosmos_rl.models` and is not imported here:
`shapes.preset` (architecture and loader), `shapes.held_out` (its held-out scorer) and
`shapes.base_build` (`python -m cosmos_rl.shapes.base_build build`, the SFT command that makes it).
"""

from cosmos_rl.shapes.caption import CaptionError, parse_caption, task_of
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
]
