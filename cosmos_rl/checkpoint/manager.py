"""Run checkpoints: DCP save/load of named components with an atomic commit, and the resume.

A save writes everything into ``step_<N>.tmp-<nonce>/`` (layout in ``checkpoint.layout``),
every rank hashes its share of the files (``checkpoint.integrity``), then rank 0 writes
``meta.json`` and ``COMMITTED``, fsyncs and renames the directory to ``step_<N>/``. A crash at
any point leaves the previously committed checkpoints untouched.

Components are saved under their own name (``policy.<fqn>``, ``optimizer.state...``); what a
component can be is in ``checkpoint.state``. Loading checks the files' sizes and checksums and
the keys against the checkpoint's index before DCP reads anything, and never unpickles
arbitrary objects (``checkpoint.dcp_io``). ``resume_latest`` is the one "continue from the
newest loadable checkpoint" every trainer uses.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from cosmos_rl.checkpoint import integrity, layout
from cosmos_rl.checkpoint.collective import (
    agree,
    barrier,
    from_rank0,
    gather_all,
    quiet_single_process,
    rank_and_world,
    single_process,
)
from cosmos_rl.checkpoint.dcp_io import describe_dcp_failure, disk_space_hint, load_dcp, read_dcp_metadata
from cosmos_rl.checkpoint.layout import COMMIT_MARKER, META_FILE, CheckpointError, CheckpointWriteError
from cosmos_rl.checkpoint.loading import build_templates
from cosmos_rl.checkpoint.state import Component, PlainState, as_component, decode_plain, encode_plain
from cosmos_rl.core.errors import UserError

log = logging.getLogger(__name__)

_COMPONENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Selection(NamedTuple):
    """What ``resume_latest`` loads from one step: the components, and whether the step must
    belong to this run (``same_run=False`` skips the run-identity check, for a DPO resume onto
    another world size, whose identity differs in the world fields only)."""

    components: dict[str, Component]
    same_run: bool = True


Choose = Callable[[int, dict[str, Any]], "Selection | dict[str, Component]"]


class CheckpointManager:
    """Saves, finds, loads and prunes the checkpoints of one run directory.

    ``keep``: how many committed checkpoints ``prune`` (called after every save) keeps,
    newest first; ``0`` keeps all. The newest committed checkpoint is never removed.
    ``run_identity`` / ``algorithm`` go into ``meta.json``; when given, ``load`` refuses a
    checkpoint whose recorded identity differs (it belongs to another run).
    All methods that touch DCP are collective: call them on every rank.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        keep: int,
        *,
        run_identity: str | None = None,
        algorithm: str | None = None,
    ):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
            raise UserError(
                f"checkpoint keep must be an integer >= 0 (got {keep!r}); 0 keeps every checkpoint"
            )
        self.root = layout.checkpoints_root(run_dir)
        self.keep = keep
        self.run_identity = run_identity
        self.algorithm = algorithm

    def step_dir(self, step: int) -> Path:
        return layout.step_dir(self.root, step)

    def committed_steps(self) -> list[int]:
        return layout.committed_steps(self.root)

    def latest_committed(self) -> int | None:
        return layout.latest_committed(self.root)

    def read_meta(self, step: int) -> dict[str, Any]:
        return layout.read_meta(self.root, step)

    # ----------------------------------------------------------------- save

    def save(
        self,
        step: int,
        components: dict[str, Component],
        extra_meta: dict[str, Any] | None = None,
    ) -> Path:
        """Write and commit ``step_<step>/`` (collective), then prune. Returns its path."""
        rank, world = rank_and_world()
        wrapped = {name: as_component(c) for name, c in components.items()}
        problems = [f"bad component name {n!r}" for n in wrapped if not _COMPONENT_NAME.match(n)]
        to_save: dict[str, Any] = {}
        for name, comp in wrapped.items():
            try:
                if isinstance(comp, PlainState):
                    flat = encode_plain(comp.capture())
                    to_save[name] = {f"rank{rank}": flat} if comp.per_rank else flat
                else:
                    to_save[name] = comp.state_dict()
            except TypeError as exc:
                problems.append(f"component {name!r}: {exc}")
        try:
            meta_text = json.dumps(extra_meta or {})
        except (TypeError, ValueError) as exc:
            problems.append(f"extra_meta is not JSON-serialisable: {exc}")
        final = self.step_dir(step)
        if rank == 0 and (final / COMMIT_MARKER).exists():
            problems.append(f"{final} is already committed; a step is saved once")
        problems = agree(problems)
        if problems:
            raise CheckpointError(f"cannot save checkpoint {final}: " + "; ".join(problems))

        nonce = from_rank0(secrets.token_hex(4) if rank == 0 else None)
        tmp = self.root / f"step_{step}.tmp-{nonce}"
        if rank == 0:
            tmp.mkdir(parents=True)
        barrier()
        try:
            with quiet_single_process():
                dcp.save(to_save, storage_writer=dcp.FileSystemWriter(str(tmp)), no_dist=single_process())
        except (dcp.CheckpointException, OSError, RuntimeError, ValueError) as exc:
            # DCP gathers failures to every rank, so all ranks raise here together, after every
            # rank has stopped writing. Remove the partial files: on a full disk they would keep
            # the next save (a preemption save, say) from fitting either.
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError(
                f"writing checkpoint {final} failed: {describe_dcp_failure(exc)}"
                f"{disk_space_hint(self.root, to_save, exc)}; the partial {tmp.name} was removed "
                "and earlier checkpoints are intact"
            ) from None
        files, checksums = self._hash_files(tmp, final, rank, world)

        error = None
        if rank == 0:
            # Any failure must reach the other ranks, or they would wait in the broadcast.
            try:
                self._commit(tmp, final, step, world, wrapped, json.loads(meta_text), files, checksums)
            except Exception as exc:
                error = f"committing {final} failed ({type(exc).__name__}: {exc}); earlier checkpoints are intact"
            else:
                try:
                    self.prune()
                except Exception as exc:
                    error = f"{final} is committed, but pruning old checkpoints failed: {type(exc).__name__}: {exc}"
        error = from_rank0(error)
        if error:
            raise CheckpointWriteError(error)
        return final

    def _hash_files(self, tmp: Path, final: Path, rank: int, world: int) -> tuple[dict[str, int], dict[str, str]]:
        """Sizes of the files DCP wrote (listed by rank 0) and their checksums, each rank hashing
        its share while the files are fresh in the page cache (collective; doubles as the
        barrier before the commit)."""
        files = from_rank0(integrity.file_sizes(tmp) if rank == 0 else None)
        mine: dict[str, str] = {}
        problems: list[str] = []
        for rel in integrity.share(files, rank, world):
            try:
                mine[rel] = integrity.digest(tmp / rel)
            except OSError as exc:
                problems.append(f"rank {rank}: cannot read back {rel} to checksum it: {exc}")
        gathered = gather_all((mine, problems))
        problems = [p for _, rank_problems in gathered for p in rank_problems]
        if problems:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError(
                f"writing checkpoint {final} failed: {'; '.join(problems)}; the partial {tmp.name} "
                "was removed and earlier checkpoints are intact"
            )
        return files, {rel: hexdigest for digests, _ in gathered for rel, hexdigest in digests.items()}

    def _commit(self, tmp, final, step, world, wrapped, extra, files, checksums) -> None:
        meta = {
            "format_version": layout.FORMAT_VERSION,
            "step": step,
            "world_size": world,
            "run_identity": self.run_identity,
            "algorithm": self.algorithm,
            "components": {
                name: (
                    {"kind": "plain", "per_rank": comp.per_rank}
                    if isinstance(comp, PlainState)
                    else {"kind": type(comp).__name__}
                )
                for name, comp in wrapped.items()
            },
            "files": files,
            "checksum_algorithm": integrity.CHECKSUM,
            "checksums": checksums,
            "saved_unix": time.time(),
            "extra": extra,
        }
        for rel in files:
            integrity.fsync_file(tmp / rel)
        integrity.write_durably(tmp / META_FILE, json.dumps(meta, indent=1, sort_keys=True))
        integrity.write_durably(tmp / COMMIT_MARKER, f"{step}\n")
        integrity.fsync_file(tmp)
        if final.exists():  # a marker-less leftover; never a committed one (checked earlier)
            final.rename(self.root / f"step_{step}.deleting-{secrets.token_hex(4)}")
        tmp.rename(final)
        integrity.fsync_file(self.root)

    # ----------------------------------------------------------------- prune

    def prune(self) -> list[int]:
        """Remove committed checkpoints beyond the newest ``keep`` and scratch directories of
        crashed saves. Rank 0 does the work; returns the removed steps."""
        rank, _ = rank_and_world()
        if rank != 0 or not self.root.is_dir():
            return []
        steps = self.committed_steps()
        doomed = steps[: -self.keep] if self.keep > 0 else []
        for step in doomed:
            # Rename first so a crash mid-delete never leaves a half-deleted "committed" step.
            trash = self.root / f"step_{step}.deleting-{secrets.token_hex(4)}"
            self.step_dir(step).rename(trash)
        for entry in self.root.iterdir():
            if layout.SCRATCH_DIR.match(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
        return doomed

    # ----------------------------------------------------------------- load

    def _local_problems(
        self, step: int, wrapped: dict[str, Stateful | PlainState], same_run: bool
    ) -> tuple[list[str], dict[str, Any], dict[str, str]]:
        """What stops this rank from loading ``step`` (empty if nothing), the templates DCP loads
        into (keyed by the name each component was saved under) and component -> saved name.
        Reads files and metadata only, never mutates the components."""
        rank, world = rank_and_world()
        path = self.step_dir(step)
        if not (path / COMMIT_MARKER).is_file():
            return [f"{path} is not a committed checkpoint (no {COMMIT_MARKER})"], {}, {}
        try:
            meta = self.read_meta(step)
        except CheckpointError as exc:
            return [str(exc)], {}, {}
        problems = []
        if same_run and self.run_identity and meta.get("run_identity") not in (None, self.run_identity):
            problems.append(f"it belongs to run {meta.get('run_identity')!r}, not {self.run_identity!r}")
        else:
            # Sizes and checksums before anything parses a byte of the step.
            problems = integrity.damaged_files(path, meta, rank, world)
        if problems:
            return problems, {}, {}
        try:
            saved = read_dcp_metadata(path).state_dict_metadata
        except Exception as exc:  # DCP raises assorted types for a damaged .metadata
            return [f"cannot read DCP metadata: {type(exc).__name__}: {exc}"], {}, {}
        return build_templates(saved, meta, wrapped, rank, world)

    def load(self, step: int, components: dict[str, Component], *, same_run: bool = True) -> dict[str, Any]:
        """Load ``step`` into ``components`` in place (collective). Returns its meta.json.

        A version-1 checkpoint's components are read under the names it used for them
        (``layout.LEGACY_NAMES``). ``same_run=False`` skips the run-identity check."""
        path = self.step_dir(step)
        wrapped = {name: as_component(c) for name, c in components.items()}
        problems, templates, stored = self._local_problems(step, wrapped, same_run)
        problems = agree(problems)
        if problems:
            raise CheckpointError(f"checkpoint {path}: " + "; ".join(problems))
        load_dcp(templates, path)  # DCP gathers read failures: every rank raises together
        rank, _ = rank_and_world()
        # Decode every plain component before restoring any, and agree, so a damaged entry on one
        # rank stops all ranks before live state changes.
        decoded: dict[str, Any] = {}
        for name, comp in wrapped.items():
            if isinstance(comp, PlainState):
                flat = templates[stored[name]]
                try:
                    decoded[name] = decode_plain(flat[f"rank{rank}"] if comp.per_rank else flat)
                except CheckpointError as exc:
                    problems.append(f"component {name!r}: {exc}")
        problems = agree(problems)
        if problems:
            raise CheckpointError(f"checkpoint {path}: " + "; ".join(problems))
        for name, comp in wrapped.items():
            try:
                if isinstance(comp, PlainState):
                    comp.restore(decoded[name])
                else:
                    comp.load_state_dict(templates[stored[name]])
            except (UserError, KeyError, TypeError, ValueError) as exc:  # decoded data that does not fit
                problems.append(f"component {name!r}: {type(exc).__name__}: {exc}")
        problems = agree(problems)
        if problems:
            raise CheckpointError(f"checkpoint {path}: " + "; ".join(problems))
        return self.read_meta(step)

    def set_aside(self, step: int) -> Path:
        """Rename a committed but unloadable ``step_<N>/`` to ``step_<N>.unloadable-<nonce>/`` (collective).

        Resuming from an older step re-runs the steps after it, and a step is saved once; the
        damaged directory is kept (never deleted) for inspection, and nothing counts it any more.
        """
        rank, _ = rank_and_world()
        nonce = from_rank0(secrets.token_hex(4) if rank == 0 else None)
        target = self.root / f"step_{step}.unloadable-{nonce}"
        if rank == 0:
            self.step_dir(step).rename(target)
        barrier()
        return target

    # ----------------------------------------------------------------- resume

    def resume_for_world(
        self, world: int, build: Callable[[bool], dict[str, Component]], *, unmarked_ok: bool = False
    ) -> tuple[int, dict[str, Component]]:
        """``resume_latest`` for a trainer that may resume onto another world size (DPO, SFT).

        A step must be this manager's ``algorithm`` (``unmarked_ok``: or record none, as DPO's
        first checkpoints did) and, at the same world size, this run's identity: at another world
        size the identity differs in the world fields only (``run.load_for_resume`` allowed that),
        and ``build(same_world)`` leaves out what cannot carry over (per-rank RNG). Returns the
        step and the loaded components, whose ``progress`` must say that step."""
        components: dict[str, Component] = {}

        def choose(step: int, meta: dict) -> Selection:
            nonlocal components
            where, found = self.step_dir(step), meta.get("algorithm")
            if found != self.algorithm and not (unmarked_ok and found is None):
                raise CheckpointError(f"{where} was written by a {found} run, not {self.algorithm}")
            same_world = meta.get("world_size") == world
            if same_world and meta.get("run_identity") != self.run_identity:
                raise CheckpointError(
                    f"{where}: run identity {meta.get('run_identity')!r} differs from this config's {self.run_identity!r}; "
                    "resume with the run's own manifest.toml, or start a new run"
                )
            components = build(same_world)
            return Selection(components, same_run=same_world)

        step, _ = self.resume_latest(choose)
        recorded = int(components[layout.PROGRESS].data["step"])
        if recorded != step:
            raise CheckpointError(f"{self.step_dir(step)}: progress says step {recorded}")
        return step, components

    def resume_latest(self, components: dict[str, Component] | Choose) -> tuple[int, dict[str, Any]]:
        """Load the newest committed step that loads, in place (collective); returns (step, meta).

        ``components`` is the dict to load, or ``choose(step, meta)`` returning it (or a
        ``Selection``) per step, for a trainer whose components depend on the step's meta.json;
        a ``CheckpointError`` it raises refuses that step. A step that cannot be loaded (missing,
        truncated or damaged files, another run's identity, keys that do not match) is warned
        about on stderr (rank 0, one line naming why) and the one before is tried. The newer,
        unloadable steps are then set aside (``set_aside``), since the steps after the chosen one
        are run and saved again. ``CheckpointError`` naming every reason when none loads, and a
        separate one when nothing was ever committed (never a silent restart from scratch)."""
        steps = self.committed_steps()
        if not steps:
            raise CheckpointError(
                f"{self.root}: no committed checkpoint to resume from; start the run again with `cosmos-rl train`"
            )
        rank, _ = rank_and_world()
        reasons = []
        for step in reversed(steps):
            try:
                chosen = components(step, self.read_meta(step)) if callable(components) else components
                selection = chosen if isinstance(chosen, Selection) else Selection(chosen)
                refusals = []
            except CheckpointError as exc:
                refusals = [str(exc)]
            refusals = agree(refusals)  # a refusal on any rank refuses the step on every rank
            try:
                if refusals:
                    raise CheckpointError("; ".join(refusals))
                meta = self.load(step, selection.components, same_run=selection.same_run)
            except CheckpointError as exc:
                reasons.append(str(exc))
                if rank == 0:
                    then = "trying an older one" if step != steps[0] else "no older one is left"
                    why = " ".join(str(exc).split())
                    print(f"cosmos-rl: warning: checkpoint step_{step} cannot be loaded, {then}: {why}", file=sys.stderr, flush=True)
                continue
            for newer in steps[steps.index(step) + 1 :]:
                moved = self.set_aside(newer)
                if rank == 0:
                    print(
                        f"cosmos-rl: warning: moved the unloadable {self.step_dir(newer)} to {moved}; "
                        f"resumed from step_{step}",
                        file=sys.stderr,
                        flush=True,
                    )
            log.info("resumed from %s", self.step_dir(step))
            return step, meta
        raise CheckpointError(
            f"none of the {len(steps)} committed checkpoints under {self.root} can be loaded: " + " | ".join(reasons)
        )
