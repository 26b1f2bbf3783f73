"""A stand-in condition from outside the package, named in a manifest as
`[model.condition] kind = "standin_conditions:FIRST_FIVE"`: the worked example of
docs/architecture.md, "Adding a condition", and the proof that a new condition needs no edit under
cosmos_rl/ (tests/test_condition_plugin.py trains and evaluates with it through the CLI).

FIRST_FIVE gives a 9-frame clip's first five frames clean (a clip continued, the pipeline's
`video=` with its leading frames given): with the shapes_video base's VAE (time halved) they are
the first three of its five latent frames, held clean in generation and left out of every loss.
"""

from cosmos_rl.core.condition import ConditionKind

FIRST_FIVE = ConditionKind("first_five", 5, "the first five frames given clean (a clip continued)")
