"""Outside text (paths, another rank's error, library messages) prints as written, never as rich markup,
and a failed run shows the rank that failed first."""

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from cosmos_rl import cli
from cosmos_rl.core.errors import Preempted, RunFailed, UserError

ROOT = Path(__file__).resolve().parent.parent
DPO = str(ROOT / "manifests" / "dpo_t2i_smoke.toml")
# What gloo puts in a rank's error: a closing-tag look-alike that rich refuses as markup.
GLOO = "rank 0: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242"


def run_cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.app(list(args))
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


@pytest.mark.parametrize(
    "exc, code, shown",
    [
        (RunFailed(GLOO), 1, "failed: " + GLOO),
        (Preempted("stopped at step 3 [/x]; resume RUN[bold]"), 75, "stopped: stopped at step 3 [/x]; resume RUN[bold]"),
        (UserError("rl.data.jsonl: /d[/x]/p.jsonl:3: malformed JSON"), 2, "error: rl.data.jsonl: /d[/x]/p.jsonl:3: malformed JSON"),
    ],
)
def test_a_run_failure_with_brackets_prints_verbatim_with_its_exit_code(capsys, monkeypatch, exc, code, shown):
    from cosmos_rl.commands import launch

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(launch, "train", fail)
    rc, _, err = run_cli(capsys, "train", DPO)
    assert rc == code
    assert shown in err
    assert "MarkupError" not in err


def test_output_dir_with_brackets_prints_verbatim_in_validate_and_plan(capsys):
    odd = "/tmp/exp[/a][bold]x"
    rc, out, _ = run_cli(capsys, "validate", DPO, f'job.output_dir="{odd}"')
    assert rc == 0 and f"run_dir     {odd}/dpo_t2i_smoke" in out
    rc, out, _ = run_cli(capsys, "plan", DPO, f'job.output_dir="{odd}"')
    assert rc == 0 and f"run {odd}/dpo_t2i_smoke" in out


def test_a_manifest_path_with_brackets_is_named_verbatim_in_its_problems(capsys, tmp_path):
    folder = tmp_path / "a[" / "odd]"  # the path then reads ".../a[/odd]/m.toml"
    folder.mkdir(parents=True)
    manifest = folder / "m.toml"
    manifest.write_text(Path(DPO).read_text())
    rc, _, err = run_cli(capsys, "validate", str(manifest), "rl.beta=0.0")
    assert rc == 2 and f"error: {manifest}: 1 problem(s)" in err


def test_the_torchrun_launch_line_prints_a_bracketed_run_dir_verbatim(tmp_path, monkeypatch):
    from cosmos_rl.config import load
    from cosmos_rl.trainers import spmd_launch

    run_dir = tmp_path / "runs[/x]" / "r"
    monkeypatch.setattr(spmd_launch, "_run_forwarding_signals", lambda argv, env, forwarded: 0)
    sink = io.StringIO()
    code = spmd_launch.start(load.load(DPO), run_dir, resume=False, console=Console(file=sink, soft_wrap=True))
    assert code == 0 and f"{run_dir}/manifest.toml" in sink.getvalue()


def _status(run_dir: Path, rank: int, code: int, message: str, mtime_ns: int) -> None:
    path = run_dir / "logs" / f"rank{rank}.status"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"code": code, "message": message}))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_the_first_failing_rank_is_shown_not_the_last(tmp_path):
    from cosmos_rl.trainers import spmd_launch

    # rank 1 failed first; rank 0 (and 2) then failed on the broken collective.
    _status(tmp_path, 1, 1, "rank 1: ValueError: the root cause", 1_000_000_000)
    _status(tmp_path, 0, 1, GLOO, 2_000_000_000)
    _status(tmp_path, 2, 1, "rank 2: RuntimeError: Connection closed by peer", 3_000_000_000)
    with pytest.raises(RunFailed, match="the root cause"):
        spmd_launch._raise_for(tmp_path, 1)
