"""DPO's data role in its own Ray actor (`grid.grouping = "per_role"`); the Ray driver of every
algorithm, DPO's included, is `trainers/ray_driver.py`.

`grid.grouping = "per_role"` (DPO only): the data role (pair source + cursor) lives in its own actor
(`DPODataActor`, no placement bundle: it only indexes and decodes pairs). Each step every policy
actor asks it for `next_batch(step, rank)` and receives only its own pairs; the first ask of a
step advances the cursor, the others are answered from the cached split, so the ranks see the same
global order as a local PairCursor. The
checkpoint's `data_cursor` is the data actor's cursor, and a resume pushes it back there.
"""

from __future__ import annotations

from cosmos_rl.core import schema

# How long a policy actor waits for its batch: the data actor only indexes an in-memory source.
DATA_TIMEOUT_S = 120.0


class DPODataActor:
    """The per_role data role: pair source + one global cursor, split per rank like PairCursor."""

    def __init__(self, config: schema.RunConfig, world_size: int):
        from cosmos_rl.data.cursor import PairCursor
        from cosmos_rl.data.pairs import build_source
        from cosmos_rl.core.media import MediaSpec

        rl = config.rl
        self.world_size = world_size
        self.source = build_source(rl.data, MediaSpec.from_model_config(config.model), config.job.seed, "rl.data")
        # world 1: the whole step's indices, which next_batch splits exactly as PairCursor does.
        self.cursor = PairCursor(len(self.source), rl.pairs_per_step, config.job.seed, 1, 0, shuffle=rl.data.shuffle)
        self._cached: tuple[int, list] | None = None

    def next_batch(self, step: int, rank: int) -> list:
        """Rank `rank`'s pairs of trainer step `step` (1-based); the step's split is cached for the other ranks."""
        if self._cached is None or self._cached[0] != step:
            indices = self.cursor.next_batch()
            share = len(indices) // self.world_size
            self._cached = (step, [indices[r * share : (r + 1) * share] for r in range(self.world_size)])
        return [self.source[i] for i in self._cached[1][rank]]

    def cursor_state(self) -> dict:
        return self.cursor.state_dict()

    def load_cursor(self, state: dict) -> None:
        self.cursor.load_state_dict(state)
        self._cached = None


class DataActorClient:
    """A policy rank's calls to the data actor, each bounded by DATA_TIMEOUT_S and failing as one
    line naming the rank (ActorGroup passes a RunFailed through as is)."""

    def __init__(self, data_actor, timeout_s: float = DATA_TIMEOUT_S):
        self.actor, self.timeout_s = data_actor, timeout_s

    def _ask(self, rank: int, ref, what: str):
        import ray

        from cosmos_rl.core.errors import RunFailed

        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RunFailed(f"rank {rank}: the data actor gave no answer to {what} within {self.timeout_s:.0f} s") from None
        except ray.exceptions.RayActorError as exc:
            raise RunFailed(f"rank {rank}: the data actor died during {what}: {str(exc).splitlines()[0][:300]}") from None

    def next_batch(self, step: int, rank: int) -> list:
        return self._ask(rank, self.actor.next_batch.remote(step, rank), "next_batch")

    def cursor_state(self, rank: int) -> dict:
        return self._ask(rank, self.actor.cursor_state.remote(), "cursor_state")

    def load_cursor(self, rank: int, state: dict) -> None:
        self._ask(rank, self.actor.load_cursor.remote(state), "load_cursor")


def start_data_actor(config: schema.RunConfig, world: int):
    """The per_role data actor (num_cpus=0: outside the policy placement, so it never competes with a rank for a bundle)."""
    import ray

    return ray.remote(DPODataActor).options(num_cpus=0, max_restarts=0).remote(config, world)
