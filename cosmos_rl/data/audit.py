"""Train/validation leakage audit over pair ids (from ``membership_ids()``)."""

from __future__ import annotations

from typing import Iterable

from cosmos_rl.core.errors import UserError


def leakage_audit(train_ids: Iterable[str], val_ids: Iterable[str], max_examples: int = 5) -> None:
    """Fail if any validation id also occurs in the training data.

    Validation on pairs the policy trained on overstates how well it generalises, and
    the run takes no implicit split, so the fix is a different held-out source.
    """
    train = set(train_ids)
    overlap: list[str] = []
    seen: set[str] = set()
    for pair_id in val_ids:
        if pair_id in train and pair_id not in seen:
            seen.add(pair_id)
            overlap.append(pair_id)
    if overlap:
        shown = ", ".join(repr(i) for i in overlap[:max_examples])
        more = f" and {len(overlap) - max_examples} more" if len(overlap) > max_examples else ""
        raise UserError(
            f"rl.validation: {len(overlap)} validation id(s) also appear in the training data "
            f"({shown}{more}); point rl.validation at a held-out source that shares no ids with rl.data"
        )
