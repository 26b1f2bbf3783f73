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
