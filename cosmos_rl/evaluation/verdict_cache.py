"""A base's per-image evaluation verdicts kept on disk, so a second `cosmos-rl eval` of a run
sharing that base samples only the checkpoint's images.

What a base's verdicts depend on, all hashed into an entry's key (`key_record`): the network that
samples (a hash of its config and every weight with its adapters off, and the VAE's
`models.latent_keys.vae_identity`), everything `Evaluator.identity` lists (prompts and their token
ids, seeds, sampler and scheduler, sample size and frames, batch size, conditioning, reward,
device), the grid's kept items, and the code (a hash of every cosmos-rl source file and the torch,
diffusers, transformers, peft and numpy versions: any change there is a miss, never a stale hit).

An entry is one JSON file, `<folder>/<key>.json`: its format, its key and the record it hashes
(for people), each item's score (and partial, with the verifier) in item order, the grid's kept
images as base64 uint8, and the SHA-256 of all of that. `read_entry` serves it only when all of it
agrees with what this evaluation expects (the key, the item count, one finite float per item inside
the reward's score range (`scores.score_range`), the
kept items and their shapes worked out from the evaluation, never read from the file) and the
checksum matches; anything else is a miss: the images are sampled again, the entry is rewritten
and one warning names the file and what was wrong (as the latent cache does,
`models.latent_entry`). Reading an entry runs no code (`json.loads`, base64), and the file's size
is bounded before it is read. The checksum detects damage, not tampering.

Exactness: a hit rebuilds the totals with `Evaluator.tally` from the same floats in the same order
as the fresh sampling added them (JSON keeps a Python float exactly), so `eval.json` and the grid
are the ones a fresh evaluation writes. Sampling itself is untouched: the same batches as without
the cache.

Where entries live (`folder_for`): a run's under `<job.output_dir>/.cache/eval/` (the folder that
holds the run directory), a bare model's beside `--out` (`<out>/../.cache/eval/`), never inside a
model folder or the installed package (the cache is off then).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.files import read_user_bytes
from cosmos_rl.evaluation.evaluator import Evaluator, Scored
from cosmos_rl.evaluation.scores import UNIT, score_range, uses_verifier
from cosmos_rl.models.latent_entry import BadEntry
from cosmos_rl.models.latent_keys import canonical_json, vae_identity

FORMAT = "cosmos-rl eval verdicts 1"
CACHE_FOLDER = Path(".cache") / "eval"
_FIELDS = ("format", "key", "record", "n_items", "scores", "partials", "kept", "sha256")
_LIBRARIES = ("torch", "diffusers", "transformers", "peft", "numpy")
_ITEM_BYTES = 64  # room per item for two floats in JSON, far more than repr needs


def folder_for(target) -> tuple[Path | None, str]:
    """(the cache folder of `target` (an `evaluation.target.Target`), or None with why it is off)."""
    import cosmos_rl
    from cosmos_rl.evaluation.target import PRESET

    root = Path(target.label).resolve().parent if target.kind == "run" else Path(target.out_dir).resolve().parent
    folder = root / CACHE_FOLDER
    forbidden = [("the installed package", Path(cosmos_rl.__file__).resolve().parent)]
    if target.kind == "model" and not target.label.startswith(PRESET):
        forbidden.append(("the model folder", Path(target.label).resolve()))
    if target.config is not None and target.config.model.path:
        forbidden.append(("the model folder model.path", Path(target.config.model.path).resolve()))
    for what, place in forbidden:
        if folder == place or place in folder.parents:
            return None, f"{folder} would be inside {what} {place}; pass an --out outside it to keep the cache"
    return folder, ""


@functools.lru_cache(maxsize=1)
def code_identity() -> str:
    """A hash of every cosmos-rl source file and the numeric libraries' versions."""
    import cosmos_rl

    package = Path(cosmos_rl.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(f"{path.relative_to(package).as_posix()}|".encode())
        digest.update(path.read_bytes())
    for name in _LIBRARIES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"|{name}={version}".encode())
    return digest.hexdigest()[:20]


def network_identity(network: torch.nn.Module) -> str:
    """A hash of the network's config and of the weights it samples with: with LoRA adapters off
    (they must be), its base weights, named as the plain network names them, so a run's base and
    the same weights elsewhere share an identity."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if any(isinstance(m, BaseTunerLayer) and not m.disable_adapters for m in network.modules()):
        raise ValueError("network_identity hashes base weights: call it with the adapters disabled")
    config = getattr(network, "config", None) or {}
    digest = hashlib.sha256(type(network).__name__.encode())
    digest.update(canonical_json({k: v for k, v in dict(config).items() if not str(k).startswith("_")}).encode())
    plain = {key.replace(".base_layer.", "."): value for key, value in network.state_dict().items() if ".lora_" not in key}
    for name, tensor in sorted(plain.items()):
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:20]


def key_record(evaluator: Evaluator, network: torch.nn.Module, keep: frozenset[int]) -> dict:
    """Everything the verdicts of `network` under `evaluator` depend on (see the module docstring)."""
    return {
        "format": FORMAT, "network": network_identity(network), "vae": vae_identity(evaluator.vae),
        "evaluation": evaluator.identity(), "kept": sorted(keep), "code": code_identity(),
    }  # fmt: skip


def entry_key(record: dict) -> str:
    return hashlib.sha256(canonical_json(record).encode()).hexdigest()


@dataclass(frozen=True)
class Expected:
    """What an entry of this evaluation must hold, worked out from the evaluation."""

    key: str
    n_items: int
    partial: bool  # the reward gives a partial score per item (the verifier)
    kept: frozenset[int]
    image_shape: tuple[int, ...]  # one kept sample: [H, W, 3], or a clip [F, H, W, 3]
    # [lo, hi] of one item's score under the reward (scores.score_range); a partial is in [0, 1]. A
    # re-signed entry of 1e308 would overflow the totals to Infinity, one of -5 is no verifier's score.
    bounds: tuple[float, float] = UNIT

    @property
    def max_bytes(self) -> int:
        """The most a whole entry can take: the record, two floats per item, the kept pixels in base64."""
        image = int(np.prod(self.image_shape))
        return 64 * 1024 + self.n_items * _ITEM_BYTES + len(self.kept) * (image * 4 // 3 + 256)


def _checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def entry_text(key: str, record: dict, done: Scored) -> str | None:
    """The whole file for `done` (one process's Scored of every item), or None when a verdict is not
    finite (never cached: every eval scores it again, as an uncached one does)."""
    values = list(done.scores) + list(done.partials or ())
    if not all(math.isfinite(v) for v in values):
        return None
    kept = [
        {"index": index, "shape": list(sample.image.shape),
         "pixels": base64.b64encode(np.ascontiguousarray(sample.image, dtype=np.uint8).tobytes()).decode("ascii")}
        for index, sample in sorted(done.kept.items())
    ]  # fmt: skip
    body = {
        "format": FORMAT, "key": key, "record": record, "n_items": len(done.scores),
        "scores": [float(v) for v in done.scores],
        "partials": None if done.partials is None else [float(v) for v in done.partials], "kept": kept,
    }  # fmt: skip
    return json.dumps({**body, "sha256": _checksum(body)}, indent=None, allow_nan=False) + "\n"


def _shown(value: object, limit: int = 60) -> str:
    """Text read from the file, escaped and cut short for a warning line."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _floats(values, n: int, what: str, bounds: tuple[float, float]) -> list[float]:
    if not isinstance(values, list) or len(values) != n:
        found = f"{len(values)} {what}" if isinstance(values, list) else f"{what} {_shown(values)}"
        raise BadEntry(f"holds {found}; this evaluation has {n} items")
    for number, value in enumerate(values):
        if type(value) is not float or not math.isfinite(value):
            raise BadEntry(f"holds {what} {number} = {_shown(value)}, not a finite float")
        if not bounds[0] <= value <= bounds[1]:
            raise BadEntry(f"holds {what} {number} = {_shown(value)}, outside [{bounds[0]:g}, {bounds[1]:g}], the range of this reward's scores")
    return values


def read_entry(path: Path, expected: Expected) -> tuple[list[float], list[float] | None, dict[int, np.ndarray]]:
    """(scores, partials, kept images by item index) of the entry at `path`, when it is a whole
    entry for `expected`; raises BadEntry otherwise."""
    try:
        size = path.stat().st_size
        if size > expected.max_bytes:
            raise BadEntry(f"is {size} bytes, more than an entry of this evaluation can be ({expected.max_bytes})")
        # core.files: a FIFO or device in an entry's place is refused, not read (forever).
        data = read_user_bytes(path, "", "cache entry", expected.max_bytes)
    except (OSError, UserError) as exc:
        raise BadEntry(f"is not a readable entry ({exc})") from None
    try:
        entry = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise BadEntry(f"is not a readable JSON entry ({_shown(str(exc), 120)})") from None
    if not isinstance(entry, dict) or "format" not in entry:
        raise BadEntry("has no entry record (not a cosmos-rl evaluation entry)")
    if entry["format"] != FORMAT:
        raise BadEntry(f"has the entry format {_shown(entry['format'])}; this release reads {FORMAT!r}")
    missing = [name for name in _FIELDS if name not in entry]
    if missing or len(entry) != len(_FIELDS):
        raise BadEntry(f"lacks the fields {missing}" if missing else f"holds fields beyond {list(_FIELDS)}")
    if entry["key"] != expected.key:
        raise BadEntry(f"was written for another evaluation (key {_shown(entry['key'])})")
    body = {name: entry[name] for name in _FIELDS if name != "sha256"}
    try:
        intact = _checksum(body) == entry["sha256"]
    except ValueError:  # a NaN or infinity written into the file
        intact = False
    if not intact:
        raise BadEntry("holds values that do not match the checksum written with them (damaged)")
    if entry["n_items"] != expected.n_items:
        raise BadEntry(f"holds {_shown(entry['n_items'])} items; this evaluation has {expected.n_items}")
    scores = _floats(entry["scores"], expected.n_items, "scores", expected.bounds)
    partials = _floats(entry["partials"], expected.n_items, "partials", UNIT) if expected.partial else None
    if not expected.partial and entry["partials"] is not None:
        raise BadEntry("holds partial scores; this reward gives none")
    samples = entry["kept"]
    if not isinstance(samples, list) or len(samples) != len(expected.kept):
        found = len(samples) if isinstance(samples, list) else _shown(samples)
        raise BadEntry(f"keeps {found} samples; this evaluation's grid shows {len(expected.kept)}")
    kept = {}
    for sample in samples:
        if not isinstance(sample, dict) or sorted(sample) != ["index", "pixels", "shape"] or type(sample["index"]) is not int:
            raise BadEntry(f"holds a kept sample {_shown(sample)} that is not {{index, shape, pixels}}")
        if sample["shape"] != list(expected.image_shape):
            raise BadEntry(f"holds a kept sample of shape {_shown(sample['shape'])}; this evaluation's are {list(expected.image_shape)}")
        try:
            pixels = base64.b64decode(sample["pixels"], validate=True)
        except (TypeError, ValueError):
            raise BadEntry(f"holds kept sample {_shown(sample['index'])} whose pixels are not base64") from None
        if len(pixels) != int(np.prod(expected.image_shape)):
            raise BadEntry(f"holds kept sample {_shown(sample['index'])} of {len(pixels)} bytes; its shape needs {int(np.prod(expected.image_shape))}")
        kept[sample["index"]] = np.frombuffer(pixels, dtype=np.uint8).reshape(expected.image_shape).copy()
    if sorted(kept) != sorted(expected.kept):
        raise BadEntry(f"keeps the items {_shown(sorted(kept))}; this evaluation's grid shows {sorted(expected.kept)}")
    return scores, partials, kept


class VerdictCache:
    """`scored(evaluator, network, keep)` through the cache in `folder` (None: off, always sampled).
    `warn` gets one line per entry not used or not written; `sampled` / `reused` count the images."""

    def __init__(self, folder: Path | None, off: str, warn: Callable[[str], None]):
        self.folder, self.off, self.warn = folder, off, warn  # `off`: why there is no folder
        self.sampled = self.reused = 0

    def summary(self, sampled_elsewhere: int) -> str:
        """The line for people: images sampled (these and `sampled_elsewhere`, the checkpoint's) and reused."""
        where = f"from the evaluation cache {self.folder}" if self.folder is not None else f"(evaluation cache off: {self.off})"
        return f"images: {self.sampled + sampled_elsewhere} sampled, {self.reused} reused {where}"

    def scored(self, evaluator: Evaluator, network: torch.nn.Module, keep: frozenset[int]) -> Scored:
        """One process's `evaluator.scored(network, keep=keep)`, its verdicts read from the cache
        when an entry verifies, else sampled and written there."""
        if self.folder is None:
            self.sampled += len(evaluator.items)
            return evaluator.scored(network, keep=keep)
        record = key_record(evaluator, network, keep)
        key = entry_key(record)
        path = self.folder / f"{key}.json"
        media = evaluator.media
        expected = Expected(
            key, len(evaluator.items), uses_verifier(evaluator.reward), frozenset(keep),
            (media.height, media.width, 3) if not media.is_video else (media.frames, media.height, media.width, 3),
            score_range(evaluator.reward),
        )  # fmt: skip
        if path.is_file():
            try:
                scores, partials, kept = read_entry(path, expected)
            except BadEntry as bad:
                self.warn(f"evaluation cache entry {path} {bad}: not used; its images are sampled again and the entry rewritten")
            else:
                self.reused += len(evaluator.items)
                return evaluator.tally(evaluator.items, scores, partials, kept)
        self.sampled += len(evaluator.items)
        done = evaluator.scored(network, keep=keep)
        text = entry_text(key, record, done)
        if text is not None:
            self._write(path, text)
        return done

    def _write(self, path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)  # atomic: another eval reading it sees a whole file or none
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            self.warn(f"evaluation cache: cannot write {path} ({exc.strerror or exc}); carrying on (the next eval samples these images again)")
