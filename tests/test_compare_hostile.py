"""`compare` and `report` read eval.json as untrusted (issue 55, item 2): wrong types, ragged or
missing tasks, deep nesting, numbers outside what a score can take, non-finite curves; each is one
line, exit 2, naming the file and the field, and compare.json never holds NaN or Infinity."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from test_compare import base_eval, cli, eval_json, nft_run


def strict_json(text: str):
    def no_constants(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=no_constants)


def good() -> dict:
    return eval_json(100, 0.32, 0.12, {"counting": 0.2, "position": -0.05})


def ragged(final: dict) -> None:
    final.update(prompt_scores={"counting": [0.1], "position": [0.2, 0.3]})


@pytest.mark.parametrize("change, field", [
    (lambda f: f.update(score="x"), "score: 'x' is not a number"),
    (lambda f: f.update(score=True), "score: True is not a number"),
    (lambda f: f.update(score=7.0), "score: 7.0 is outside [0, 1]"),
    (lambda f: f.update(score=-3.0), "score: -3.0 is outside [0, 1]"),
    (lambda f: f.update(tasks=[1, 2]), "tasks: list is not a non-empty object"),
    (lambda f: f.update(diff_score=1e308, diff_score_interval=[-1e308, 1e308]), "diff_score: 1e+308 is outside [-1, 1]"),
    (lambda f: f["diff_tasks"].pop("counting"), "diff_tasks: holds the tasks ['position']"),
    (lambda f: f.update(diff_score_interval="ab"), "diff_score_interval: 'ab' is not an interval"),
    (lambda f: f.update(score_interval=[0.5, 0.1]), "score_interval: [0.5, 0.1] has lo > hi"),
    (lambda f: f["tasks_interval"].update(counting=[0.0, 2.0]), "tasks_interval.counting[1]: 2.0 is outside [0, 1]"),
    (lambda f: f.update(step="abc"), "step: 'abc' is not a step"),
    (lambda f: f.update(sampler=json.loads("[" * 900 + "]" * 900)), "nested deeper than 8 levels"),
    (ragged, "prompt_scores: holds 3 prompts' scores, \"n_prompts\" is 319"),
    (lambda f: f.update(prompt_scores={"counting": [0.1, "x"], "position": [0.2]}), "prompt_scores.counting[1]: 'x' is not a number"),
])  # fmt: skip
def test_a_hostile_eval_json_is_one_line_naming_the_file_and_field(tmp_path, change, field):
    final = good()
    change(final)
    a, b = nft_run(tmp_path, "a"), nft_run(tmp_path, "b", final=final)
    code, output = cli(a, b, "--out", tmp_path / "out")
    assert code == 2, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    assert f"{b / 'eval' / 'eval.json'}" in output.replace("\n", "") and field in output, output
    assert not (tmp_path / "out").exists()


def test_a_report_refuses_a_score_outside_its_range(tmp_path):
    final = good()
    final["score"] = 7.0
    run = nft_run(tmp_path, "a", final=final)
    from typer.testing import CliRunner

    from cosmos_rl.cli import app

    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and "score: 7.0 is outside [0, 1]" in result.output, result.output


def test_prompt_scores_of_other_lengths_in_two_runs_are_refused(tmp_path):
    a_final = {**eval_json(100, 0.3, 0.1, {"counting": 0.1, "position": 0.0}, n_prompts=4),
               "prompt_scores": {"counting": [0.0, 0.4], "position": [0.5, 0.4]}}
    b_final = {**eval_json(100, 0.3, 0.1, {"counting": 0.1, "position": 0.0}, n_prompts=4),
               "prompt_scores": {"counting": [0.2], "position": [0.5, 0.4, 0.3]}}  # fmt: skip
    a, b = nft_run(tmp_path, "a", final=a_final), nft_run(tmp_path, "b", final=b_final)
    code, output = cli(a, b, "--out", tmp_path / "out")
    assert code == 2 and "prompt_scores\" holds {'counting': 1, 'position': 3} prompts per task" in output.replace("\n", ""), output


@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
    ('{"kind": "model", "score": NaN}', "NaN is not a JSON number"),
    ('{"kind": "model", "target": "preset:shapes", "score": 1e308}', "score: 1e+308 is outside [0, 1]"),
], ids=["deep", "nan", "huge"])  # fmt: skip
def test_a_hostile_base_eval_is_one_line(tmp_path, text, needle):
    run = nft_run(tmp_path, "a")
    path = tmp_path / "base.json"
    path.write_text(text)
    code, output = cli(run, "--base-eval", path, "--out", tmp_path / "out")
    assert code == 2 and needle in output and "Traceback" not in output, output


def test_a_fifo_as_base_eval_is_refused_without_blocking(tmp_path):
    import signal

    def deadline(*_):
        raise TimeoutError("compare blocked on the FIFO")

    run = nft_run(tmp_path, "a")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    previous = signal.signal(signal.SIGALRM, deadline)
    signal.alarm(30)  # a blocking open of a FIFO with no writer never returns: fail instead of hanging
    try:
        code, output = cli(run, "--base-eval", fifo, "--out", tmp_path / "out")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert code == 2 and "not a regular file" in output, output


def test_base_score_and_margin_outside_the_rewards_range_are_refused(tmp_path):
    run = nft_run(tmp_path, "a")
    code, output = cli(run, "--base-score", "1e308", "--out", tmp_path / "out")
    assert code == 2 and "--base-score: 1e+308 is outside [0, 1]" in output, output
    code, output = cli(run, "--base-score", "0.2", "--margin", "1e308", "--out", tmp_path / "out")
    assert code == 2 and "--margin: 1e+308 is more than" in output, output


def test_a_non_finite_curve_point_is_left_out_and_compare_json_stays_strict(tmp_path):
    run = nft_run(tmp_path, "a")
    rows = [{"step": 50, "eval/score": "nan", "time/rollout_s": 1e308}, {"step": 100, "eval/score": 0.4, "time/rollout_s": 1e308},
            {"step": 100, "eval/score_lo": "-inf", "eval/score_hi": 0.5}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, output = cli(run, "--out", tmp_path / "out")
    assert code == 0, output
    result = strict_json((tmp_path / "out" / "compare.json").read_text())
    (only,) = result["runs"]
    assert [p["step"] for p in only["curve"]] == [100]  # NaN at step 50 left out
    assert only["curve"][0]["lo"] is None and only["wall_s"] is None  # -inf bound dropped; 2 x 50 x 1e308 s overflows: n/a
    assert "eval/score at step 50 is nan: left out of the curve" in output


def test_a_curve_score_outside_the_rewards_range_is_refused(tmp_path):
    run = nft_run(tmp_path, "a")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 100, "eval/score": 1e308}) + "\n")
    code, output = cli(run, "--out", tmp_path / "out")
    assert code == 2 and "step 100: eval/score = 1e+308 is outside [0, 1]" in output, output


def test_an_empty_out_is_refused_and_writes_nothing(tmp_path):
    run = nft_run(tmp_path, "a")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, output = cli(run, "--out", "")
    finally:
        os.chdir(here)
    assert code == 2 and "--out: empty" in output, output
    assert not (tmp_path / "compare.json").exists() and not (tmp_path / "compare.png").exists()


def test_a_base_eval_from_eval_is_still_accepted(tmp_path):
    run = nft_run(tmp_path, "a")
    code, output = cli(run, "--base-eval", base_eval(tmp_path), "--out", tmp_path / "out")
    assert code == 0, output
