"""`cosmos-rl export RUN_DIR --out FOLDER [--step N]`: a run's committed checkpoint (the newest by
default) as a model folder.

The run is opened exactly as `cosmos-rl eval RUN_DIR` opens it (`evaluation.target`: the saved
manifest's model with the checkpoint's `policy` loaded, files and run identity checked first). The
folder is what diffusers' stock `Cosmos3OmniPipeline.save_pretrained` writes (model_index.json,
transformer/, vae/, text_tokenizer/, scheduler/, safetensors weights), so diffusers loads it as a
pipeline and a later run names it as `model.path` (or `rl.init_from`):

- LoRA runs: the `policy` adapter is folded into the weights (W + scaling * B @ A), so the folder
  holds a plain transformer with no peft state (a GRPO run with `rl.ema_decay` > 0: its moving
  average, the run's model, loaded into that adapter);
- full fine-tunes: the trained transformer as it is;
- SFT `vae` runs: the base transformer with the trained VAE.

An NFT run that set `rl.sampler_shift` writes that shift into `scheduler/`: its rollouts, and so
what it learned, used it. Besides, `cosmos_rl.json` keeps the model's prompt template (the shapes base's `minimal`) and
where the folder came from (run, step, algorithm, run identity, and the sampler the run is
evaluated with: steps and guidance are arguments of a pipeline call, not part of a folder). The folder is written under a
temporary name beside FOLDER (`.FOLDER.export-PID-XXXX`) and renamed when complete, so an
interrupted export leaves no half-written model behind; one that was killed outright (SIGKILL, so
its clean-up never ran) leaves that temporary folder, and the next export of the same FOLDER
removes it once its pid is gone. The finished folder has the modes the user's umask gives.

Two exports to one FOLDER: the first takes an advisory lock (`.FOLDER.export.lock` beside it,
flock, so a crashed holder frees it); the second exits 2 naming the first's pid. SIGTERM or SIGINT
while the folder is written removes the temporary folder and exits 75, leaving nothing behind.
An --out whose name is not UTF-8, or too long for the temporary name beside it, is refused first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from cosmos_rl.core.errors import UserError


LOCK = ".{name}.export.lock"  # beside --out: held by the export writing it
NAME_MAX = 255 - 48  # a file name is at most 255 bytes; the temporary ".NAME.export-PID-XXXXXXXX" adds up to 48
STAGING = ".{name}.export-{pid}-"  # the temporary folder beside --out: its name, the exporting pid, a random part
_STAGING_RE = re.compile(r"^\.(?P<name>.+)\.export-(?P<pid>[0-9]+)-[A-Za-z0-9_]+$")


def check_out_folder(out: Path) -> None:
    """--out must be a new (or empty) folder: an export never overwrites a model. Missing parent
    folders are made (`make_parent`, once the model is loaded), so the nearest one that exists must
    be a folder. Judged before anything loads."""
    try:
        str(out).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"--out {ascii(str(out))}: not UTF-8 text; pass a folder name in UTF-8") from None
    if len(out.name.encode("utf-8")) > NAME_MAX:
        raise UserError(f"--out: its last name is {len(out.name.encode('utf-8'))} bytes, more than the {NAME_MAX} a folder "
                        "name can have beside its temporary name; pass a shorter name")  # fmt: skip
    if out.is_symlink():
        # The finished folder is renamed onto --out, which would replace the link itself rather
        # than fill the folder it points to: name that folder instead.
        raise UserError(f"--out {str(out)!r}: is a symbolic link (to {os.readlink(out)!r}); pass the folder it points to, or a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {str(out)!r}: already exists and is not an empty folder; pick a new folder or delete it")
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"--out {str(out)!r}: {str(ancestor)!r} is a file, not a folder; pass a folder path")


def make_parent(out: Path) -> None:
    """Make --out's missing parent folders (the folder itself is renamed into place when complete)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {str(out)!r}: cannot create its parent folder ({exc.strerror}); pass a writable path") from None


def export_run(
    run_dir: str, out: Path, *, step: int | None = None, progress: Callable[[str], None] = lambda line: None
) -> dict:
    """Write the run's committed checkpoint `step` (None: the newest) to `out` as a model folder;
    returns the summary."""
    from cosmos_rl.evaluation.target import open_run

    out = Path(out)
    check_out_folder(out)  # first: a bad --out is refused before the run is even opened
    target = open_run(run_dir, step=step)  # refuses a folder that is not a run, or a --step it lacks; loads nothing
    import torch
    from diffusers import Cosmos3OmniPipeline

    from cosmos_rl.planning import plan
    from cosmos_rl.models.build import MODEL_INFO

    progress(f"loading {'the newest committed checkpoint' if step is None else f'checkpoint step {step}'} of {run_dir}")
    model = target.load(torch.device("cpu"))
    config = target.config  # the run's saved manifest, as open_run read it
    parts = model.model_parts
    with model.policy() as network:
        transformer, merged = _plain_transformer(network)
    scheduler, sampler = parts.scheduler, target.settings.resolved(parts)
    if sampler.shift != float(scheduler.config["flow_shift"]):  # an NFT run's rl.sampler_shift: what its rollouts used
        scheduler = type(scheduler).from_config(scheduler.config, flow_shift=sampler.shift)
    pipe = Cosmos3OmniPipeline(
        transformer=transformer, text_tokenizer=parts.tokenizer, vae=parts.vae, scheduler=scheduler,
        enable_safety_checker=False, use_native_flow_schedule=parts.native_flow_schedule,
    )  # fmt: skip
    summary = {
        "run": str(Path(run_dir).resolve()), "step": target.step, "algorithm": config.rl.algorithm, "run_identity": plan.run_identity(config),
        "lora_merged": merged, "trained": _trained(config), "sampler": sampler.as_json(), "out": str(out),
    }  # fmt: skip
    make_parent(out)
    with _out_lock(out), _stop_on_signals():
        check_out_folder(out)  # again, under the lock: an export that held it before may have filled --out
        for stale in remove_stale_staging(out):
            progress(f"removed {stale}, left by an export that was killed")
        staging = Path(tempfile.mkdtemp(prefix=STAGING.format(name=out.name, pid=os.getpid()), dir=out.parent))
        try:
            progress(f"writing the model folder (step {target.step}, {summary['trained']})")
            pipe.save_pretrained(staging, safe_serialization=True)
            info = {"prompt_template": parts.prompt_template, "exported_from": {k: summary[k] for k in ("run", "step", "algorithm", "run_identity", "sampler")}}
            (staging / MODEL_INFO).write_text(json.dumps(info, indent=1, allow_nan=False) + "\n", encoding="utf-8")
            apply_umask(staging)
            if out.exists():
                out.rmdir()  # empty (checked above)
            os.replace(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return summary


@contextlib.contextmanager
def _out_lock(out: Path):
    """Hold `.NAME.export.lock` beside --out for the write, or refuse (another export holds it)."""
    path = out.parent / LOCK.format(name=out.name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"--out {str(out)!r}: cannot create its lock file {path} ({exc.strerror}); pass a writable folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise UserError(f"--out {str(out)!r}: another export (pid {holder}) is writing it; wait for it to finish, or pick another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.unlink(path)  # while held: a second export that opened the old file re-checks --out under it
    finally:
        os.close(fd)


@contextlib.contextmanager
def _stop_on_signals():
    """SIGTERM and SIGINT raise Preempted while the folder is written, so the temporary folder is
    removed and the CLI exits 75 (requeue); the previous handlers come back afterwards."""
    import signal
    import threading

    from cosmos_rl.core.errors import Preempted

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise Preempted(f"export stopped by {signal.Signals(signum).name}; the partial folder was removed, nothing was written")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def remove_stale_staging(out: Path) -> list[Path]:
    """Remove the temporary folders an earlier export of the same --out left beside it when it was
    killed (SIGKILL, a power cut: no `finally` ran). A folder counts as stale only when the pid in
    its name is no longer running, so a concurrent export of the same --out keeps its own."""
    removed = []
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _STAGING_RE.match(entry.name)
        if not match or match["name"] != out.name or not entry.is_dir() or entry.is_symlink():
            continue
        if _alive(int(match["pid"])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or a pid no kernel has): leave its folder alone
    return True


def apply_umask(folder: Path) -> None:
    """Give the exported folder the modes any new file of the user gets: mkdtemp makes it 0700 and
    some writers 0600, which would keep the group (a shared model store) out of a public model."""
    mask = os.umask(0)
    os.umask(mask)
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)


def _plain_transformer(network):
    """(a transformer without peft state holding the policy's weights, whether LoRA was merged)."""
    from cosmos_rl.models import lora

    if not getattr(network, "peft_config", None):
        return network, False
    plain = type(network).from_config(network.config)
    plain.load_state_dict(lora.merged_state_dict(network, "policy"), strict=True)
    return plain.eval(), True


def _trained(config) -> str:
    from cosmos_rl.config import algorithms

    if algorithms.of(config).trained_part(config.rl) == "vae":
        return "the VAE (base transformer)"
    return "LoRA merged into the transformer" if config.model.lora.rank > 0 else "the whole transformer"
