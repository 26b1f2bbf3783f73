"""Preference pairs for Diffusion-DPO: the record, the source protocol, and the sources.

Every source returns :class:`PreferencePair` records of the run's ``media``
(:class:`~cosmos_rl.core.media.MediaSpec`): images at its frame size (resize rule in
:mod:`cosmos_rl.data.images`); it lists its ids with ``membership_ids()`` without decoding any
image, for the train/val leakage audit. With ``media.frames`` > 1 (a video run) every side is a clip
[3, F, H, W] of exactly that size (mp4 files and members,
decoded by :mod:`cosmos_rl.data.clips`, never resized; generated clips for synthetic pairs).

- :class:`SyntheticPairs` - generated in memory (smoke runs, CI)
- :class:`JsonlPairs` - a JSONL index of image files
- :class:`TarShardPairs` - webdataset tar shards
- :func:`factory_source` - any importable ``module:function``

Per-side prompts (``winner_prompt`` / ``loser_prompt``) are checked against the pair's
prompt with :func:`check_source_symmetry`, given the model's tokenizer.
"""

from cosmos_rl.core.media import MediaSpec
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


def build_source(data, media: MediaSpec, job_seed: int, what: str):
    """The pair source a data section (`schema.PreferenceDataConfig`) names, its sides of `media`
    (images at its size, clips of its frames when a video); synthetic pairs win over any file source."""
    from cosmos_rl.core.errors import UserError

    if data.synthetic_pairs:
        return SyntheticPairs(data.synthetic_pairs, media, job_seed + data.synthetic_seed)
    if data.jsonl:
        return JsonlPairs(data.jsonl, media)
    if data.shards:
        return TarShardPairs(list(data.shards), media)
    if data.factory:
        return factory_source(data.factory, media, **dict(data.factory_kwargs))
    raise UserError(f"{what}: no pair source; set {what}.synthetic_pairs, .jsonl, .shards or .factory")
