"""The Ray actor group's failure handling: a dead or stuck actor becomes RunFailed naming its rank,
an actor's UserError stays a UserError, and a placement the cluster cannot satisfy fails fast with
the needed and available CPUs instead of leaving actors waiting forever."""

from __future__ import annotations

import pytest

from cosmos_rl.core import schema
from cosmos_rl.dist.ray_group import ActorGroup
from cosmos_rl.core.errors import RunFailed, UserError

pytestmark = pytest.mark.slow


def _probe_class():
    # Defined in a function so Ray ships it by value (the tests folder is not importable in actors).
    class Probe:
        def __init__(self, rank, world_size, tag):
            self.rank, self.tag = rank, tag

        def pick_port(self):
            return ("127.0.0.1", 0)

        def setup_world(self, address):
            return None

        def whoami(self):
            return (self.rank, self.tag)

        def die_on(self, rank):
            if self.rank == rank:
                import os

                os._exit(3)
            return self.rank

        def hang_on(self, rank):
            import time

            if self.rank == rank:
                # Well past the 2 s the test waits; short, because the next call on this actor queues behind it.
                time.sleep(6)
            return self.rank

        def refuse_on(self, rank):
            if self.rank == rank:
                from cosmos_rl.core.errors import UserError

                raise UserError("rl.something: refused")
            return self.rank

    return Probe


def _group(**grid) -> ActorGroup:
    config = schema.GridConfig(backend="ray", device="cpu", timeout_s=30.0, cpus_per_rank=0.25, **grid)
    return ActorGroup(config, 2, _probe_class(), ("t",))


def test_call_all_returns_answers_in_rank_order_and_names_failing_ranks(ray_cluster):
    group = _group()
    try:
        group.start()
        assert group.call_all("whoami") == [(0, "t"), (1, "t")]
        with pytest.raises(UserError, match="rl.something"):
            group.call_all("refuse_on", 0)
        with pytest.raises(RunFailed, match=r"rank 1: no answer to hang_on within 2 s"):
            group.call_all("hang_on", 1, timeout_s=2)
        with pytest.raises(RunFailed, match=r"^rank 1: the actor died during die_on"):
            group.call_all("die_on", 1)
    finally:
        group.shutdown()
    assert ray_cluster.is_initialized()  # the session's cluster is joined, never shut down


def test_unsatisfiable_placement_fails_with_needed_and_available(ray_cluster, monkeypatch):
    monkeypatch.setattr("cosmos_rl.dist.ray_group.PLACEMENT_TIMEOUT_S", 2.0)
    group = ActorGroup(schema.GridConfig(backend="ray", device="cpu", cpus_per_rank=64.0), 2, _probe_class(), ("t",))
    try:
        with pytest.raises(UserError, match=r"needs \{'CPU': 128\.0\}.*grid\.cpus_per_rank"):
            group.start()
        assert group.actors == []
    finally:
        group.shutdown()


def test_impossible_request_fails_before_waiting_for_the_placement(ray_cluster):
    # The default placement wait (60 s) stays in force: only the up-front totals check can be this quick.
    import time

    group = ActorGroup(schema.GridConfig(backend="ray", device="cpu", cpus_per_rank=64.0), 2, _probe_class(), ("t",))
    began = time.monotonic()
    try:
        with pytest.raises(UserError, match=r"needs \{'CPU': 128\.0\}, but the Ray cluster has \{'CPU': 2\.0\} in total"):
            group.start()
        assert time.monotonic() - began < 10.0 and group.actors == []
    finally:
        group.shutdown()


def test_a_gpu_grid_on_a_cluster_without_enough_gpus_points_at_grid_device(ray_cluster):
    # One rank more than the cluster has GPUs (none on a CPU runner): the message is about GPUs
    # and grid.device, not CPU counts.
    gpus = int(ray_cluster.cluster_resources().get("GPU", 0))
    group = ActorGroup(schema.GridConfig(backend="ray", device="cuda"), gpus + 1, _probe_class(), ("t",))
    try:
        with pytest.raises(UserError) as error:
            group.start()
        message = str(error.value)
        assert message.startswith(f'grid.device: "cuda" puts each of the {gpus + 1} ranks on its own GPU, but the Ray cluster has {gpus} GPU(s)')
        assert "cpus_per_rank" not in message and group.actors == []
    finally:
        group.shutdown()
