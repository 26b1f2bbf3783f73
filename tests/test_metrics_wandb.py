"""The Weights & Biases sink, against a stand-in `wandb` module (W&B itself is outside the project)."""

import json
import sys
import types

import pytest

from cosmos_rl.config import load
from cosmos_rl.core.metrics import MetricsWriter


class FakeRun:
    def __init__(self, calls):
        self.calls = calls

    def log(self, data, step):
        self.calls.append(("log", step, data))

    def finish(self):
        self.calls.append(("finish",))


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = []
    module = types.ModuleType("wandb")
    module.init = lambda **kwargs: calls.append(("init", kwargs)) or FakeRun(calls)
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_rows_go_to_wandb_with_their_step_and_the_same_run_id_on_resume(tmp_path, fake_wandb):
    job = load.structure({"rl": {"algorithm": "dpo"}, "job": {"wandb_project": "proj", "wandb_entity": "team"}}).job
    writer = MetricsWriter.for_job(job, tmp_path, enabled=True, run_config={"rl.beta": 1.0})
    writer.write(1, {"train/loss": 0.5})
    writer.close()
    resumed = MetricsWriter.for_job(job, tmp_path, enabled=True, resume_step=1)
    resumed.close()

    (first_init, first_kwargs), log, finish, (second_init, second_kwargs), _ = fake_wandb
    assert first_kwargs["project"] == "proj" and first_kwargs["entity"] == "team" and first_kwargs["config"] == {"rl.beta": 1.0}
    assert log == ("log", 1, {"train/loss": 0.5}) and finish == ("finish",)
    assert second_kwargs["id"] == first_kwargs["id"] and second_kwargs["resume"] == "allow"
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["train/loss"] == 0.5  # JSONL still written


def test_no_wandb_when_not_asked_for(tmp_path, fake_wandb):
    job = load.structure({"rl": {"algorithm": "dpo"}}).job
    writer = MetricsWriter.for_job(job, tmp_path, enabled=True)
    writer.write(1, {"train/loss": 0.5})
    writer.close()
    assert fake_wandb == []


def test_only_rank_0_starts_a_wandb_run(tmp_path, fake_wandb):
    job = load.structure({"rl": {"algorithm": "dpo"}, "job": {"wandb_project": "proj"}}).job
    MetricsWriter.for_job(job, tmp_path, enabled=False).write(1, {"train/loss": 0.5})
    assert fake_wandb == []
