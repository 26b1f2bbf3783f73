"""One metrics interface with sinks: `metrics.jsonl` always; TensorBoard and Weights & Biases when the
manifest asks for them (`job.tensorboard`, `job.wandb_project`); plus progress.

Only rank 0 writes. A resumed run first drops rows past the step it resumes from, so the file of an
interrupted-and-resumed run equals the file of a straight run.
"""

from __future__ import annotations

import json
import math
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
        self.path.write_text("".join(line + "\n" for line in kept))

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
    """A rich progress bar on rank 0: step, chosen metrics, items/s and ETA; a no-op elsewhere."""

    def __init__(self, *, enabled: bool, total: int, start: int, unit: str, fields: tuple[str, ...]):
        self.enabled, self.unit, self.fields = enabled, unit, fields
        self._bar = None
        self._t0, self._items = time.perf_counter(), 0
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn
        from rich.console import Console

        self._bar = RichProgress(
            TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[stats]}", markup=False),
            TimeRemainingColumn(), console=Console(stderr=True), transient=False, refresh_per_second=4,
        )
        self._task = self._bar.add_task("train", total=total, completed=start, stats="")
        self._bar.start()

    def update(self, step: int, metrics: dict[str, float], items: int) -> None:
        if not self._bar:
            return
        self._items += items
        rate = self._items / max(time.perf_counter() - self._t0, 1e-9)
        stats = "  ".join(f"{k.split('/')[-1]} {float(metrics[k]):.4g}" for k in self.fields if k in metrics)
        self._bar.update(self._task, completed=step, stats=f"{stats}  {rate:.2f} {self.unit}/s")

    def close(self) -> None:
        if self._bar:
            self._bar.stop()
