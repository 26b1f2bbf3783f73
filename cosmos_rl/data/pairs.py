"""Preference pairs for Diffusion-DPO: the record, the source protocol, and the sources.

Every source returns :class:`PreferencePair` records with images at the requested
``size`` (a side or (height, width); resize rule in :mod:`cosmos_rl.data.images`) and lists its ids with
``membership_ids()`` without decoding any image, for the train/val leakage audit.

- :class:`SyntheticPairs` - generated in memory (smoke runs, CI)
- :class:`JsonlPairs` - a JSONL index of image files
- :class:`TarShardPairs` - webdataset tar shards
- :func:`factory_source` - any importable ``module:function``

Per-side prompts (``winner_prompt`` / ``loser_prompt``) are checked against the pair's
prompt with :func:`check_source_symmetry`, given the model's tokenizer.
"""

from cosmos_rl.data.jsonl_pairs import JsonlPairs
from cosmos_rl.data.pair_factory import CheckedFactorySource, factory_source
from cosmos_rl.data.pair_record import (
    PairSource,
    PreferencePair,
    PromptSides,
    check_pair,
    check_source_symmetry,
    check_symmetry,
)
from cosmos_rl.data.synthetic_pairs import SyntheticPairs
from cosmos_rl.data.tar_pairs import IMAGE_EXTENSIONS, TarShardPairs

__all__ = [
    "CheckedFactorySource",
    "IMAGE_EXTENSIONS",
    "JsonlPairs",
    "PairSource",
    "PreferencePair",
    "PromptSides",
    "SyntheticPairs",
    "TarShardPairs",
    "check_pair",
    "check_source_symmetry",
    "check_symmetry",
    "factory_source",
]
