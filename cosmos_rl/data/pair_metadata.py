"""The metadata part of a preference row (id, prompt, per-side prompts), shared by the JSONL and tar
formats; torch-free, so `validate` reads rows with the run's own parser."""

from __future__ import annotations

from typing import Any, Optional

from cosmos_rl.core.errors import UserError


# Keys some preference datasets use to mark a tie; a tie carries no preference to learn.
def _tie_problem(row: dict) -> Optional[str]:
    if "tie" in row and row["tie"] not in (False, None):
        return f'"tie": {row["tie"]!r}'
    if "label" in row and row["label"] != 1:
        return f'"label": {row["label"]!r}'
    return None


def parse_pair_metadata(row: Any, origin: str) -> tuple[str, str, Optional[str], Optional[str]]:
    """Validate the metadata part of a row: ``(id, prompt, winner_prompt, loser_prompt)``.

    Rejects ties (``"tie": true`` or a ``"label"`` other than 1): this format says which
    side won by field name, so a label can only mean a tie or a swapped pair.
    """
    if not isinstance(row, dict):
        raise UserError(f"{origin}: expected a JSON object, found {type(row).__name__}")
    tie = _tie_problem(row)
    if tie is not None:
        raise UserError(
            f"{origin}: row carries {tie}, a tie or re-weighted label; DPO needs a strict "
            "preference given by the winner/loser fields - drop ties and the label key"
        )
    for key in ("id", "prompt"):
        if key not in row:
            raise UserError(f"{origin}: missing field {key!r}; every row needs 'id' and 'prompt'")
        if not isinstance(row[key], str) or not row[key].strip():
            raise UserError(
                f"{origin}: field {key!r} must be a non-empty string, found {row[key]!r}"
                + (" (quote numeric ids)" if key == "id" else "")
            )
    sides = []
    for key in ("winner_prompt", "loser_prompt"):
        value = row.get(key)
        if value is not None and not isinstance(value, str):
            raise UserError(f"{origin}: field {key!r} must be a string, found {value!r}")
        sides.append(value)
    return row["id"], row["prompt"], sides[0], sides[1]
