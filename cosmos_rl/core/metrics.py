"""One metrics interface with sinks: `metrics.jsonl` always; TensorBoard and Weights & Biases when the
manifest asks for them (`job.tensorboard`, `job.wandb_project`); plus progress.

Only rank 0 writes. A resumed run first drops rows past the step it resumes from, so the file of an
interrupted-and-resumed run equals the file of a straight run.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


class MetricsWriter:
    @classmethod
    def for_job(cls, job, run_dir: Path, *, enabled: bool, resume_step: int | None = None, run_config: dict | None = None) -> "MetricsWriter":
        """The writer with the sinks `job` (the manifest's [job] table) asks for."""
        return cls(
            run_dir, enabled=enabled, tensorboard=job.tensorboard, resume_step=resume_step,
            wandb_project=job.wandb_project, wandb_entity=job.wandb_entity, run_config=run_config,
        )

    def __init__(
        self,
        run_dir: Path,
        *,
        enabled: bool,
        tensorboard: bool = False,
        resume_step: int | None = None,
        wandb_project: str = "",
        wandb_entity: str = "",
        run_config: dict | None = None,
    ):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        if wandb_project:
            self._wandb = _start_wandb(Path(run_dir), wandb_project, wandb_entity, run_config, resumed=resume_step is not None)
        if resume_step is not None:
            self._truncate_after(resume_step)
        elif self.path.exists():
            self.path.unlink()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=(resume_step or 0) + 1)

    def _truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        # A process killed mid-write leaves at most one torn row, the last; it lies past the resumed
        # step anyway (the checkpoint commit came before it), so drop it. A torn row anywhere else is
        # real damage and fails loudly.
        if lines and not _parses(lines[-1]):
            lines.pop()
        for number, line in enumerate(lines, start=1):
            if not _parses(line):
                from cosmos_rl.core.errors import UserError

                raise UserError(f"{self.path}:{number}: not a JSON metrics row; repair or delete that line, then resume again")
        kept = [line for line in lines if json.loads(line)["step"] <= step]
        # Written beside and renamed over: a kill mid-write must not lose the rows of the steps
        # kept, and a reader (`report`, a watcher tailing the file) sees the old rows or the new.
        partial = self.path.with_name(self.path.name + ".truncating")
        partial.write_text("".join(line + "\n" for line in kept))
        os.replace(partial, self.path)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(run_dir: Path, project: str, entity: str, run_config: dict | None, resumed: bool):
    import wandb

    # One W&B run per run directory, so a requeued run keeps appending to the same W&B run.
    run_id = _wandb_run_id(run_dir)
    return wandb.init(
        project=project, entity=entity or None, name=run_dir.name, id=run_id, resume="allow" if resumed else None,
        dir=str(run_dir), config=run_config or {},
    )


def _wandb_run_id(run_dir: Path) -> str:
    import hashlib

    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def _parses(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: a row nested too deeply to read
        return False


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep it visible rather than dropping the row
    return value


class Progress:
    """Progress of the step loop on the main process; a no-op elsewhere or with `job.progress` off.

    Where it goes depends on who reads it. On a terminal (stderr and stdout both are one): the rich
    bar on stderr. Otherwise (`nohup ... > log`, a batch scheduler's output file, a pipe): plain
    lines on stdout, never wrapped or cut, each with the step, the `fields` metrics, the rate and the
    ETA: one every `every_steps` steps (the manifest's `job.log_every`), at the last step, and
    whenever `every_s` seconds (`job.progress_every_s`) passed since the last line; a step (or a
    checkpoint, an evaluation) that runs longer than that gets a line saying so from a heartbeat
    thread, so a log never goes quiet for more than `every_s` seconds while training. (stdout a log
    but stderr a terminal: both.)
    """

    def __init__(
        self, *, enabled: bool, total: int, start: int, unit: str, fields: tuple[str, ...],
        every_steps: int = 1, every_s: float = 30.0, bar: bool | None = None, lines: bool | None = None,
        clock=time.monotonic, heartbeat: bool = True,
    ):  # fmt: skip
        import sys
        import threading

        self.enabled, self.unit, self.fields = enabled, unit, fields
        self.total, self.start = total, start
        self.every_steps, self.every_s = max(1, int(every_steps)), float(every_s)
        self._clock = clock
        self._bar = None
        self._t0, self._items = time.perf_counter(), 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = None
        self._began = clock()  # the loop's start
        self._step_began = self._began  # when the last step finished: the running one began
        self._last_line = self._began
        self._last_step, self._printed_step = start, start
        if not enabled:
            self.lines = False
            return
        # The real stdout, taken before the bar starts: a rich bar on a terminal stderr replaces
        # sys.stdout with a proxy onto that terminal, and the lines belong in the pipe or file.
        self._out = sys.stdout
        if bar is None:
            bar = sys.stderr.isatty()
        self.lines = (not bar or not sys.stdout.isatty()) if lines is None else lines
        if bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn
            from rich.console import Console

            self._bar = RichProgress(
                TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[stats]}", markup=False),
                TimeRemainingColumn(), console=Console(stderr=True), transient=False, refresh_per_second=4,
            )
            self._task = self._bar.add_task("train", total=total, completed=start, stats="")
            self._bar.start()
        if self.lines:
            self._print(f"step {start}/{total}: training steps {start + 1} to {total}; a line every {self.every_steps} "
                        f"step(s) or {self.every_s:g} s")  # fmt: skip
            if heartbeat:
                self._beat = threading.Thread(target=self._heartbeat_loop, name="cosmos-rl-progress", daemon=True)
                self._beat.start()

    # ------------------------------------------------------------------ what the loop calls
    def update(self, step: int, metrics: dict[str, float], items: int) -> None:
        if not self.enabled:
            return
        self._items += items
        rate = self._items / max(time.perf_counter() - self._t0, 1e-9)
        if self._bar:
            stats = "  ".join(f"{k.split('/')[-1]} {float(metrics[k]):.4g}" for k in self.fields if k in metrics)
            self._bar.update(self._task, completed=step, stats=f"{stats}  {rate:.2f} {self.unit}/s")
        if self.lines:
            with self._lock:
                now = self._clock()
                self._last_step, self._step_began = step, now
                due = step - self._printed_step >= self.every_steps or now - self._last_line >= self.every_s or step >= self.total
                if due:
                    self._printed_step = step
                    self._line_locked(now, self.step_line(step, metrics, rate, now))

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        if self._bar:
            self._bar.stop()

    # ------------------------------------------------------------------ the plain lines
    def step_line(self, step: int, metrics: dict[str, float], rate: float, now: float) -> str:
        """`step 12/40 (30%)  train/loss 0.1234  ...  2.31 pairs/s  elapsed 0:00:31  eta 0:01:13`."""
        shown = [k for k in self.fields if k in metrics] + [k for k in SCORE_KEYS if k in metrics and k not in self.fields]
        stats = "".join(f"  {k} {_number(metrics[k])}" for k in shown)
        percent = round(100 * step / max(self.total, 1))
        return f"step {step}/{self.total} ({percent}%){stats}  {rate:.3g} {self.unit}/s  {self._times(now)}"

    def heartbeat(self) -> str | None:
        """The heartbeat thread's check: a line when `every_s` seconds passed since the last one
        (a step, or an evaluation inside it, running long), else None. Returns what it printed."""
        with self._lock:
            now = self._clock()
            if self._last_step >= self.total or now - self._last_line < self.every_s:
                return None
            # Since the last finished step, not "into the step": a checkpoint or an evaluation after
            # that step may be what is running.
            since = f"step {self._last_step} finished" if self._last_step > self.start else "training started"
            line = f"step {self._last_step + 1}/{self.total} running: {now - self._step_began:.0f} s since {since}  {self._times(now)}"
            self._line_locked(now, line)
            return line

    def _heartbeat_loop(self) -> None:
        # Checks a few times per interval, so a line is at most a fraction of every_s late.
        while not self._stop.wait(max(self.every_s / 4, 0.05)):
            self.heartbeat()

    def _times(self, now: float) -> str:
        """Elapsed, and the ETA: the mean step so far times the steps left, less what the running
        step has already taken."""
        done = self._last_step - self.start
        if done > 0:
            per_step = (self._step_began - self._began) / done
            eta = _clock_text(max(per_step * (self.total - self._last_step) - (now - self._step_began), 0.0))
        else:
            eta = "?"
        return f"elapsed {_clock_text(now - self._began)}  eta {eta}"

    def _line_locked(self, now: float, line: str) -> None:
        self._last_line = now
        self._print(line)

    def _print(self, line: str) -> None:
        # flush: stdout to a file is block-buffered, and a log is read while the run goes on
        print(line, file=self._out, flush=True)


# Held-out scores shown on a progress line whenever a step logged them (besides the trainer's fields).
SCORE_KEYS = ("eval/score", "val/loss")


def _number(value) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)


def _clock_text(seconds: float) -> str:
    """Seconds as H:MM:SS (a day or more as `Nd H:MM:SS`)."""
    if not math.isfinite(seconds):
        return "?"
    whole = int(round(max(seconds, 0.0)))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{days}d " if days else "") + f"{hours}:{minutes:02d}:{secs:02d}"
