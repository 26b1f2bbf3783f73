"""The metrics sinks: metrics.jsonl (fresh, resumed, torn) and TensorBoard event files read back."""

import json

import pytest

from cosmos_rl.core.errors import UserError
from cosmos_rl.core.metrics import MetricsWriter


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_steps(run_dir, steps, scale=1.0, **kw):
    writer = MetricsWriter(run_dir, enabled=True, **kw)
    for step in steps:
        writer.write(step, {"train/loss": scale * step})
    writer.close()


def test_resume_drops_rows_past_the_checkpoint_so_the_file_matches_a_straight_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    run_steps(straight, range(1, 7))
    run_steps(resumed, range(1, 6))  # interrupted after step 5; the last checkpoint was step 3
    run_steps(resumed, range(4, 7), resume_step=3)
    assert rows(resumed) == rows(straight) == [{"step": s, "train/loss": float(s)} for s in range(1, 7)]


def test_a_fresh_run_replaces_an_old_file_and_keeps_non_finite_values(tmp_path):
    run_steps(tmp_path, range(1, 4))
    writer = MetricsWriter(tmp_path, enabled=True)
    writer.write(1, {"train/loss": float("nan"), "train/kl_loss": float("inf")})
    writer.close()
    assert rows(tmp_path) == [{"step": 1, "train/loss": "nan", "train/kl_loss": "inf"}]


def test_a_disabled_writer_writes_nothing(tmp_path):
    run_steps(tmp_path, range(1, 3))
    MetricsWriter(tmp_path, enabled=False, resume_step=0).write(3, {"train/loss": 1.0})
    assert [r["step"] for r in rows(tmp_path)] == [1, 2]  # not truncated, not appended: not rank 0


def test_resume_drops_a_torn_last_row_but_refuses_a_torn_middle_row(tmp_path):
    run_steps(tmp_path, range(1, 4))
    path = tmp_path / "metrics.jsonl"
    path.write_text(path.read_text() + '{"step": 4, "train/lo')  # killed mid-write
    run_steps(tmp_path, [4], resume_step=3)
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4]
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{torn", *lines[1:]]) + "\n")
    with pytest.raises(UserError, match=r"metrics\.jsonl:2: not a JSON metrics row"):
        MetricsWriter(tmp_path, enabled=True, resume_step=2)


def test_a_resume_that_fails_while_rewriting_the_file_loses_no_row(tmp_path, monkeypatch):
    """The kept rows are written beside the file and renamed over it: a reader, or a kill mid-write,
    sees the old rows or the new, never an empty or half file (a watcher once read it empty)."""
    from pathlib import Path

    run_steps(tmp_path, range(1, 6))
    before = (tmp_path / "metrics.jsonl").read_text()
    real_write_text = Path.write_text

    def write_then_die(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", write_then_die)
    with pytest.raises(OSError, match="disk full"):
        MetricsWriter(tmp_path, enabled=True, resume_step=3)
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text() == before
    run_steps(tmp_path, [4], resume_step=3)
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4]


def test_tensorboard_sink_is_read_back_and_purged_on_resume(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_steps(tmp_path, range(1, 6), tensorboard=True)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    run_steps(tmp_path, range(4, 7), scale=10.0, tensorboard=True, resume_step=3)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert "train/loss" in events.Tags()["scalars"]
    # Steps 4 and 5 of the interrupted attempt are purged; the resumed values replace them.
    got = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert got == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]


# ------------------------------------------------------------------------------ progress in a log
class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def log_progress(clock, **kw):
    from cosmos_rl.core.metrics import Progress

    args = dict(enabled=True, total=10, start=0, unit="pairs", fields=("train/loss",), every_steps=3, every_s=30.0,
                bar=False, lines=None, clock=clock, heartbeat=False)  # fmt: skip
    return Progress(**{**args, **kw})


def test_a_log_gets_a_plain_line_every_n_steps_every_m_seconds_and_at_the_last_step(capsys):
    """Not a terminal (pytest captures stdout): plain lines on stdout, never a bar, with the step,
    the metrics, the rate and the ETA; every 3 steps, or once 30 s passed, and at step 10."""
    clock = FakeClock()
    progress = log_progress(clock)
    assert progress.lines and progress._bar is None
    for step in range(1, 11):
        clock.now += 40.0 if step == 5 else 1.0  # step 5 takes 40 s: its line is due by time, not by count
        progress.update(step, {"train/loss": 0.5 / step, "train/grad_norm": 2.0, "eval/score": 0.25}, 8)
    progress.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step 0/10: training steps 1 to 10; a line every 3 step(s) or 30 s")
    printed = [int(line.split()[1].split("/")[0]) for line in lines[1:]]
    assert printed == [3, 5, 8, 10]
    last = lines[-1]
    assert last.startswith("step 10/10 (100%)  train/loss 0.05  eval/score 0.25  ") and " pairs/s  elapsed 0:00:49  eta 0:00:00" in last
    assert "grad_norm" not in last  # only the trainer's fields and the held-out scores
    assert "step 3/10 (30%)" in lines[1] and "elapsed 0:00:03  eta 0:00:07" in lines[1]  # 1 s a step so far: 7 s for 7 steps


def test_a_long_step_gets_a_heartbeat_line_so_a_log_never_goes_quiet_longer_than_m_seconds(capsys):
    clock = FakeClock()
    progress = log_progress(clock, every_steps=100)
    clock.now += 29.0
    assert progress.heartbeat() is None  # not yet 30 s since the header line
    clock.now += 2.0
    assert progress.heartbeat() == "step 1/10 running: 31 s since training started  elapsed 0:00:31  eta ?"
    assert progress.heartbeat() is None  # the beat itself counts as a line
    clock.now += 9.0
    progress.update(1, {"train/loss": 1.0}, 1)  # 40 s after the start, 9 s after the beat: no line
    # step 2's ETA: step 1 took 40 s, so 9 steps take 360 s, 30 of which step 2 has run
    clock.now += 30.0
    assert progress.heartbeat() == "step 2/10 running: 30 s since step 1 finished  elapsed 0:01:10  eta 0:05:30"
    progress.close()
    assert capsys.readouterr().out.splitlines()[1:] == [
        "step 1/10 running: 31 s since training started  elapsed 0:00:31  eta ?",
        "step 2/10 running: 30 s since step 1 finished  elapsed 0:01:10  eta 0:05:30",
    ]


def test_the_heartbeat_thread_stops_with_the_loop():
    progress = log_progress(FakeClock(), heartbeat=True, every_s=0.01)
    assert progress._beat is not None and progress._beat.is_alive()
    progress.close()
    assert not progress._beat.is_alive()


def test_progress_off_or_another_rank_prints_nothing(capsys):
    for progress in (log_progress(FakeClock(), enabled=False), log_progress(FakeClock(), enabled=False, lines=True)):
        progress.update(10, {"train/loss": 1.0}, 1)
        assert progress._beat is None and not progress.lines  # no heartbeat thread either
        progress.close()
    assert capsys.readouterr().out == ""


def test_a_terminal_keeps_the_rich_bar_and_gets_no_lines(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    progress = log_progress(FakeClock(), bar=True)
    assert progress._bar is not None and not progress.lines
    progress.update(3, {"train/loss": 1.0}, 1)
    progress.close()
    assert capsys.readouterr().out == ""


def test_with_a_terminal_bar_on_stderr_the_lines_still_reach_a_piped_stdout(tmp_path):
    """`cosmos-rl train M | tee log` at a terminal: the bar draws on stderr (a terminal) and rich then
    routes sys.stdout onto that terminal; the plain lines must still go down the pipe."""
    import os
    import pty
    import subprocess
    import sys

    script = (
        "from cosmos_rl.core.metrics import Progress\n"
        "p = Progress(enabled=True, total=3, start=0, unit='x', fields=('train/loss',), heartbeat=False)\n"
        "assert p._bar is not None and p.lines\n"
        "for step in (1, 2, 3):\n"
        "    p.update(step, {'train/loss': 0.5}, 1)\n"
        "p.close()\n"
    )
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=follower, text=True, timeout=120,
                              env={**os.environ, "TERM": "xterm"})  # fmt: skip
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 0
    assert [line.split("  ")[0] for line in done.stdout.splitlines()] == [
        "step 0/3: training steps 1 to 3; a line every 1 step(s) or 30 s", "step 1/3 (33%)", "step 2/3 (67%)", "step 3/3 (100%)"]
