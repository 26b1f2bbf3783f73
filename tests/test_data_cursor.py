import pytest

from cosmos_rl.data.cursor import PairCursor, check_divisible
from cosmos_rl.core.errors import UserError


def _run(cursor, steps):
    return [cursor.next_batch() for _ in range(steps)]


def test_check_divisible():
    check_divisible(8, 4)
    for pairs, world in [(6, 4), (0, 2), (3, 0)]:
        with pytest.raises(UserError, match=rf"rl\.pairs_per_step: {pairs} pairs cannot be split evenly"):
            check_divisible(pairs, world)
    with pytest.raises(UserError, match="rl.pairs_per_step"):
        PairCursor(10, 5, seed=0, world_size=2, rank=0)


def test_each_epoch_visits_every_pair_once_and_epochs_differ():
    cursor = PairCursor(12, 4, seed=5, world_size=1, rank=0)
    epochs = [sum(_run(cursor, 3), []) for _ in range(3)]
    for order in epochs:
        assert sorted(order) == list(range(12))
    assert epochs[0] != epochs[1] != epochs[2]


def test_steps_crossing_an_epoch_boundary_drop_nothing():
    cursor = PairCursor(5, 3, seed=1, world_size=1, rank=0)
    stream = sum(_run(cursor, 5), [])  # 15 positions = exactly 3 epochs of 5
    for epoch in range(3):
        assert sorted(stream[epoch * 5 : (epoch + 1) * 5]) == list(range(5))


def test_seed_changes_the_order():
    assert _run(PairCursor(50, 10, 0, 1, 0), 1) != _run(PairCursor(50, 10, 1, 1, 0), 1)


def test_ranks_split_the_global_batch_into_disjoint_contiguous_shares():
    whole = _run(PairCursor(20, 8, seed=3, world_size=1, rank=0), 5)
    shares = [_run(PairCursor(20, 8, seed=3, world_size=4, rank=r), 5) for r in range(4)]
    for step in range(5):
        assert sum((shares[r][step] for r in range(4)), []) == whole[step]
        assert all(len(shares[r][step]) == 2 for r in range(4))


def test_resume_continues_exactly_where_it_stopped():
    straight = _run(PairCursor(13, 4, seed=9, world_size=2, rank=1), 12)
    first = PairCursor(13, 4, seed=9, world_size=2, rank=1)
    before = _run(first, 6)
    state = first.state_dict()
    assert all(type(value) is int for value in state.values())
    resumed = PairCursor(13, 4, seed=9, world_size=2, rank=1)
    resumed.load_state_dict(dict(state))
    after = _run(resumed, 6)
    assert before + after == straight
    assert resumed.step == 12


def test_resume_on_another_world_size_keeps_the_global_order():
    whole = _run(PairCursor(16, 4, seed=2, world_size=1, rank=0), 6)
    first = PairCursor(16, 4, seed=2, world_size=1, rank=0)
    _run(first, 3)
    halves = []
    for rank in range(2):
        cursor = PairCursor(16, 4, seed=2, world_size=2, rank=rank)
        cursor.load_state_dict(first.state_dict())
        halves.append(_run(cursor, 3))
    assert [halves[0][s] + halves[1][s] for s in range(3)] == whole[3:]


@pytest.mark.parametrize("key, value", [("seed", 1), ("size", 14), ("per_step", 8), ("version", 99)])
def test_incompatible_state_is_refused(key, value):
    saved = PairCursor(13, 4, seed=0, world_size=1, rank=0).state_dict()
    saved[key] = value
    with pytest.raises(UserError, match=r"rl\.data \(preference cursor\)"):
        PairCursor(13, 4, seed=0, world_size=1, rank=0).load_state_dict(saved)


def test_empty_source_is_refused():
    with pytest.raises(UserError, match="empty"):
        PairCursor(0, 2, seed=0, world_size=1, rank=0)
