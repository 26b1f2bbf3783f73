"""The evaluation cache (`evaluation.verdict_cache`): a second `cosmos-rl eval` of a run sharing a
base samples only the checkpoint's images and writes what a fresh eval writes; a damaged entry is
sampled again with a warning naming it; anything that decides the verdicts (seeds, sampler, batch,
reward, weights, size) keys the entry; where the cache lives.

The runs are copies of the committed fixture tests/fixtures/old_runs/nft_lora (a tiny LoRA NFT run
from preset:tiny); its expected.json holds the older code's eval numbers, so a cached eval is
checked against values this code did not produce."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cosmos_rl.evaluation import verdict_cache
from cosmos_rl.evaluation.evaluator import Evaluator, Sample, Scored
from cosmos_rl.evaluation.scores import UNIT, score_range
from cosmos_rl.evaluation.verdict_cache import Expected, entry_text, read_entry
from cosmos_rl.models.latent_entry import BadEntry

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "old_runs"
# tests/test_old_run_dirs.py's evaluation of the fixtures: one prompt per task, one seed, 4 steps.
EVAL = {"reward": "brightness", "per_task": 1, "seeds": 1, "sample_steps": 4, "device": "cpu"}
EVAL_KEYS = ("step", "score", "base_score", "tasks", "base_tasks", "sampler", "image_size")
ITEMS = 6  # one prompt of each of the six tasks, one seed


@pytest.fixture
def sampled(monkeypatch):
    """The number of items every Evaluator.sample call of the test sampled, in call order."""
    calls: list[int] = []
    original = Evaluator.sample

    def counting(self, transformer, items):
        calls.append(len(items))
        return original(self, transformer, items)

    monkeypatch.setattr(Evaluator, "sample", counting)
    return calls


def _runs(tmp_path: Path, *names: str) -> list[Path]:
    """Copies of the NFT fixture run in one folder (their job.output_dir), as runs of one base."""
    root = tmp_path / "runs"
    for name in names:
        shutil.copytree(FIXTURES / "nft_lora", root / name)
    return [root / name for name in names]


def _eval(run: Path | str, out: Path, notes: list[str], warnings: list[str] | None = None, **options) -> dict:
    from cosmos_rl.commands.evaluate import run_eval

    def warn(line: str) -> None:  # the cache's lines (the fixture's prompts also warn: training prompts)
        if warnings is not None and line.startswith("evaluation cache"):
            warnings.append(line)

    return run_eval(str(run), out_dir=out, note=notes.append, warn=warn, **{**EVAL, **options})


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.json"))


def test_a_second_eval_of_a_run_sharing_the_base_samples_only_the_checkpoint_and_matches_a_fresh_eval(tmp_path, sampled):
    first_run, second_run = _runs(tmp_path, "first", "second")
    cache = tmp_path / "runs" / ".cache" / "eval"
    notes: list[str] = []
    _eval(first_run, tmp_path / "e1", notes)
    assert sampled == [ITEMS, ITEMS] and notes == [f"images: {2 * ITEMS} sampled, 0 reused from the evaluation cache {cache}"]
    assert len(_entries(cache)) == 1  # the base's entry; the checkpoint is never cached

    sampled.clear()
    cached = _eval(second_run, tmp_path / "e2", notes)
    assert sampled == [ITEMS]  # the checkpoint only: its base's verdicts came from the first run's eval
    assert notes[-1] == f"images: {ITEMS} sampled, {ITEMS} reused from the evaluation cache {cache}"
    expected = json.loads((FIXTURES / "expected.json").read_text())["nft_lora"]["eval"]
    assert {key: cached[key] for key in EVAL_KEYS} == expected  # the older code's numbers, base included

    shutil.rmtree(cache)
    sampled.clear()
    fresh = _eval(second_run, tmp_path / "fresh", notes)
    assert sampled == [ITEMS, ITEMS]
    written = [json.loads((tmp_path / out / "eval.json").read_text()) for out in ("e2", "fresh")]
    assert [{k: v for k, v in w.items() if k != "grid"} for w in written] == [{k: v for k, v in fresh.items() if k != "grid"}] * 2
    # The grid's base row is drawn from the cached pixels: the very PNG a fresh eval draws.
    assert (tmp_path / "e2" / "before_after.png").read_bytes() == (tmp_path / "fresh" / "before_after.png").read_bytes()


def _eval_tiny(out: Path, notes: list[str], warnings: list[str] | None = None, **options) -> dict:
    """A bare preset:tiny (its own verdicts are cached, beside --out), 2 sampler steps."""
    return _eval("preset:tiny", out, notes, warnings, **{"sample_steps": 2, "suite": "shapes", **options})


def test_a_damaged_entry_is_sampled_again_with_a_warning_naming_it_and_rewritten(tmp_path, sampled):
    notes: list[str] = []
    first = _eval_tiny(tmp_path / "e", notes)
    (entry,) = _entries(tmp_path / ".cache" / "eval")
    body = json.loads(entry.read_text())
    body["scores"][0] += 0.25  # a changed verdict, the file still valid JSON
    entry.write_text(json.dumps(body))

    sampled.clear()
    warnings: list[str] = []
    again = _eval_tiny(tmp_path / "e", notes, warnings)
    assert warnings == [f"evaluation cache entry {entry} holds values that do not match the checksum written with them "
                        "(damaged): not used; its images are sampled again and the entry rewritten"]  # fmt: skip
    assert sampled == [ITEMS] and notes[-1].startswith(f"images: {ITEMS} sampled, 0 reused")
    assert again == first

    entry.write_text(entry.read_text()[:100])  # torn
    warnings.clear()
    assert _eval_tiny(tmp_path / "e", notes, warnings) == first
    assert len(warnings) == 1 and warnings[0].startswith(f"evaluation cache entry {entry} is not a readable JSON entry")

    sampled.clear()
    warnings.clear()
    assert _eval_tiny(tmp_path / "e", notes, warnings) == first  # the rewritten entry verifies
    assert warnings == [] and sampled == [] and notes[-1].startswith(f"images: 0 sampled, {ITEMS} reused")


def test_more_seeds_or_other_sampler_steps_miss_the_cache(tmp_path, sampled):
    notes: list[str] = []
    _eval_tiny(tmp_path / "e", notes)
    sampled.clear()
    _eval_tiny(tmp_path / "e", notes, seeds=2)
    assert sampled == [2 * ITEMS] and notes[-1].startswith(f"images: {2 * ITEMS} sampled, 0 reused")
    sampled.clear()
    _eval_tiny(tmp_path / "e", notes, sample_steps=3)
    assert sampled == [ITEMS] and notes[-1].startswith(f"images: {ITEMS} sampled, 0 reused")
    assert len(_entries(tmp_path / ".cache" / "eval")) == 3  # one per evaluation, none overwritten


# ------------------------------------------------------------------------------- the key, unit level
@pytest.fixture(scope="module")
def tiny():
    from cosmos_rl.models.build import build_preset

    return build_preset("tiny", 0)


def _evaluator(parts, **changes) -> Evaluator:
    from cosmos_rl.evaluation.prompts import held_out_captions
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.models.sampler_settings import SamplerSettings
    from cosmos_rl.suites import registry as suites

    options = {"captions": held_out_captions(suites.get("shapes"), 1), "seeds": 1, "reward": "shapes_strict",
               "settings": SamplerSettings(4, None, 1.0), "media": MediaSpec.image(32), "batch_size": 32, **changes}  # fmt: skip
    media = options["media"]
    return Evaluator(
        options["captions"], options["seeds"], options["reward"], options["settings"], tokenizer=parts.tokenizer,
        vae=parts.vae, media=media, latent_shape=(4, 1, media.height // 4, media.width // 4),
        device=torch.device("cpu"), batch_size=options["batch_size"], model_parts=parts,
    )  # fmt: skip


def test_everything_that_decides_the_verdicts_keys_the_entry(tiny):
    from cosmos_rl.core.media import MediaSpec
    from cosmos_rl.models.sampler_settings import SamplerSettings

    keep = frozenset({0, 1})

    def key(parts=tiny, network=None, kept=keep, **changes) -> str:
        return verdict_cache.entry_key(verdict_cache.key_record(_evaluator(parts, **changes), network or parts.transformer, kept))

    same = key()
    assert key() == same  # nothing random in it
    changed = {
        "seeds": key(seeds=2), "steps": key(settings=SamplerSettings(5, None, 1.0)),
        "shift": key(settings=SamplerSettings(4, 2.0, 1.0)), "guidance": key(settings=SamplerSettings(4, None, 2.0)),
        "batch": key(batch_size=4), "reward": key(reward="shapes_partial"), "size": key(media=MediaSpec.image(16)),
        "prompts": key(captions=["a red circle"]), "grid": key(kept=frozenset({0})),
    }  # fmt: skip
    assert same not in changed.values() and len(set(changed.values())) == len(changed)
    other = SimpleNamespace(**vars(tiny))
    other.transformer = type(tiny.transformer).from_config(tiny.transformer.config)
    other.transformer.load_state_dict(tiny.transformer.state_dict())
    assert key(other) == same  # a copy of the same weights: one identity
    with torch.no_grad():
        next(other.transformer.parameters()).view(-1)[0] += 1e-3
    assert key(other) != same


def test_a_lora_networks_base_identity_is_its_base_weights_and_needs_the_adapters_off(tiny):
    import copy

    from cosmos_rl.models import lora

    plain = verdict_cache.network_identity(tiny.transformer)
    adapted = copy.deepcopy(tiny.transformer)
    lora.add_adapters(adapted, 2, 2.0, ["policy"])
    with torch.no_grad():  # a trained adapter: the base weights stay what they were
        for tensor in lora.adapter_tensors(adapted, "policy").values():
            tensor.add_(0.5)
    with pytest.raises(ValueError, match="adapters disabled"):
        verdict_cache.network_identity(adapted)
    with lora.adapters_disabled(adapted):
        assert verdict_cache.network_identity(adapted) == plain


# ------------------------------------------------------------------------------ the entry, unit level
def _entry(tmp_path: Path, partial: bool = True) -> tuple[Path, Expected, Scored]:
    image = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
    scores, partials = (1.0, 0.0, 0.1), ((1.0, 0.5, 1 / 3) if partial else None)
    kept = {1: Sample(image, scores[1], partials[1] if partial else None)}
    done = Scored(totals=None, prompts=None, kept=kept, scores=scores, partials=partials)
    path = tmp_path / "k.json"
    path.write_text(entry_text("k", {"what": "made it"}, done))
    return path, Expected("k", 3, partial, frozenset({1}), (4, 4, 3)), done


def test_an_entry_reads_back_exactly(tmp_path):
    path, expected, done = _entry(tmp_path)
    scores, partials, kept = read_entry(path, expected)
    assert scores == [1.0, 0.0, 0.1] and partials == [1.0, 0.5, 1 / 3]  # floats kept bit for bit
    assert list(kept) == [1] and kept[1].dtype == np.uint8 and np.array_equal(kept[1], done.kept[1].image)
    path, expected, _ = _entry(tmp_path, partial=False)
    assert read_entry(path, expected)[1] is None


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda e: e.update(scores=[1.0, 0.0, 0.2]), "do not match the checksum"),
        (lambda e: e.update(format="cosmos-rl eval verdicts 0"), "has the entry format 'cosmos-rl eval verdicts 0'"),
        (lambda e: e.pop("kept"), "lacks the fields ['kept']"),
        (lambda e: e.update(key="other"), "was written for another evaluation"),
    ],
)
def test_a_damaged_entry_is_refused_saying_what_was_wrong(tmp_path, damage, message):
    path, expected, _ = _entry(tmp_path)
    entry = json.loads(path.read_text())
    damage(entry)
    path.write_text(json.dumps(entry))
    with pytest.raises(BadEntry, match=message.replace("[", r"\[").replace("(", r"\(")):
        read_entry(path, expected)


def test_an_entry_of_other_sizes_or_counts_is_refused_even_with_a_matching_checksum(tmp_path):
    path, expected, _ = _entry(tmp_path)
    with pytest.raises(BadEntry, match="holds 3 items; this evaluation has 4"):
        read_entry(path, Expected("k", 4, True, frozenset({1}), (4, 4, 3)))
    with pytest.raises(BadEntry, match=r"shape \[4, 4, 3\]; this evaluation's are \[8, 8, 3\]"):
        read_entry(path, Expected("k", 3, True, frozenset({1}), (8, 8, 3)))
    with pytest.raises(BadEntry, match="keeps 1 samples; this evaluation's grid shows 2"):
        read_entry(path, Expected("k", 3, True, frozenset({1, 2}), (4, 4, 3)))
    with pytest.raises(BadEntry, match="holds partial scores; this reward gives none"):
        read_entry(path, Expected("k", 3, False, frozenset({1}), (4, 4, 3)))
    path.write_text("[" * 50_000)  # within the size bound, nested past the parser's recursion limit
    with pytest.raises(BadEntry, match="is not a readable JSON entry"):
        read_entry(path, expected)
    path.write_bytes(b" " * (expected.max_bytes + 1))
    with pytest.raises(BadEntry, match="bytes, more than an entry of this evaluation can be"):
        read_entry(path, expected)


def test_a_score_that_is_not_finite_is_never_cached(tmp_path):
    done = Scored(totals=None, prompts=None, kept={}, scores=(1.0, float("nan")), partials=None)
    assert entry_text("k", {}, done) is None


# ------------------------------------------------------------------------------------- where it lives
def test_the_cache_lives_beside_the_run_or_the_out_folder_never_in_a_model_folder(tmp_path):
    from cosmos_rl.evaluation.target import Target

    def target(kind, label, out, model_path=""):
        config = SimpleNamespace(model=SimpleNamespace(path=model_path)) if kind == "run" else None
        return Target(label=str(label), kind=kind, settings=None, media=None, out_dir=out, config=config)

    runs = tmp_path / "runs"
    assert verdict_cache.folder_for(target("run", runs / "a", runs / "a" / "eval")) == (runs / ".cache" / "eval", "")
    assert verdict_cache.folder_for(target("model", "preset:tiny", tmp_path / "eval" / "x")) == (tmp_path / "eval" / ".cache" / "eval", "")
    model = tmp_path / "model"
    folder, why = verdict_cache.folder_for(target("model", model, model / "eval"))
    assert folder is None and f"would be inside the model folder {model}" in why
    assert verdict_cache.folder_for(target("model", model, tmp_path / "out" / "m"))[0] == tmp_path / "out" / ".cache" / "eval"
    folder, why = verdict_cache.folder_for(target("run", model / "runs" / "a", None, model_path=str(model)))
    assert folder is None and "model.path" in why


def test_the_command_prints_images_sampled_and_reused_on_stderr(tmp_path):
    from typer.testing import CliRunner

    from cosmos_rl.cli import app

    runner = CliRunner()
    args = ["eval", "preset:tiny", "--suite", "shapes", "--json", "--per-task", "1", "--seeds", "1", "--sample-steps", "2", "--device", "cpu"]
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    second = runner.invoke(app, [*args, "--out", str(tmp_path / "b")])
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    cache = tmp_path / ".cache" / "eval"
    # Not a terminal: the sampling's progress line (one sampler call: the first is the last), then the count.
    assert first.stderr.splitlines()[0].startswith(f"eval: model: {ITEMS} of {ITEMS} images (")
    assert first.stderr.splitlines()[1:] == [f"images: {ITEMS} sampled, 0 reused from the evaluation cache {cache}"]
    assert second.stderr.splitlines() == [f"images: 0 sampled, {ITEMS} reused from the evaluation cache {cache}"]  # nothing sampled
    results = [json.loads(r.stdout) for r in (first, second)]  # stdout stays one JSON object
    assert [{k: v for k, v in r.items() if k != "grid"} for r in results][0] == {k: v for k, v in results[1].items() if k != "grid"}


@pytest.mark.parametrize(("scores", "partials", "bounds", "message"), [
    ([1e308, 0.0, 0.1], [1.0, 0.5, 0.2], UNIT, "holds scores 0 = 1e+308, outside [0, 1]"),  # totals would overflow to Infinity
    ([-5.0, 0.0, 0.1], [1.0, 0.5, 0.2], UNIT, "holds scores 0 = -5.0, outside [0, 1]"),
    ([1.0, 0.0, 0.1], [1.0, 2.0, 0.2], UNIT, "holds partials 1 = 2.0, outside [0, 1]"),
    ([-5.0, 0.0, 0.1], [1.0, 0.5, 0.2], score_range("jpeg_incompressibility"), "holds scores 0 = -5.0, outside [0, 1e+06]"),
])  # fmt: skip
def test_a_resigned_entry_outside_the_rewards_range_is_refused(tmp_path, scores, partials, bounds, message):
    """An entry re-signed (checksum recomputed) with scores no reward gives: a miss, never a score."""
    from cosmos_rl.evaluation.verdict_cache import _checksum

    path, expected, _ = _entry(tmp_path)
    entry = json.loads(path.read_text())
    entry.update(scores=scores, partials=partials)
    entry["sha256"] = _checksum({k: v for k, v in entry.items() if k != "sha256"})
    path.write_text(json.dumps(entry))
    with pytest.raises(BadEntry, match=re.escape(message)):
        read_entry(path, Expected("k", 3, True, frozenset({1}), (4, 4, 3), bounds))
