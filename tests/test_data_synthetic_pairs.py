import torch

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.data.pairs import PairSource, SyntheticPairs
from cosmos_rl.data.vocab import COLOUR_RGB, SHAPES


def _total_variation(image):
    return (image[:, 1:] - image[:, :-1]).abs().mean() + (image[:, :, 1:] - image[:, :, :-1]).abs().mean()


def test_deterministic_from_seed_and_random_access():
    first, again = SyntheticPairs(6, MediaSpec.image(16), seed=3), SyntheticPairs(6, MediaSpec.image(16), seed=3)
    assert isinstance(first, PairSource)
    for index in (5, 0, 2):  # any order gives the same records
        a, b = first[index], again[index]
        assert (a.id, a.prompt) == (b.id, b.prompt)
        assert torch.equal(a.winner, b.winner) and torch.equal(a.loser, b.loser)


def test_other_seed_gives_other_ids_and_images():
    a, b = SyntheticPairs(4, MediaSpec.image(16), seed=0), SyntheticPairs(4, MediaSpec.image(16), seed=1)
    assert not set(a.membership_ids()) & set(b.membership_ids())
    assert any(not torch.equal(a[i].loser, b[i].loser) for i in range(4))


def test_membership_ids_are_unique_and_match_records():
    source = SyntheticPairs(20, MediaSpec.image(8), seed=0)
    ids = source.membership_ids()
    assert len(ids) == len(set(ids)) == len(source) == 20
    assert ids == [source[i].id for i in range(20)]


def test_records_follow_the_documented_preference():
    source = SyntheticPairs(24, MediaSpec.image(32), seed=7)
    for index in range(len(source)):
        pair = source[index]
        article, colour, shape = pair.prompt.split()
        assert article == "a" and colour in COLOUR_RGB and shape in SHAPES
        for image in (pair.winner, pair.loser):
            assert image.shape == (3, 32, 32) and image.dtype == torch.float32
            assert image.min() >= 0 and image.max() <= 1
        # winner: smooth, and its shape is painted in the prompt's colour
        target = torch.tensor(COLOUR_RGB[colour]).view(3, 1, 1)
        core = (pair.winner - target).abs().amax(dim=0) < 0.02
        assert core.sum() >= 4
        # loser: noisy, and the same pixels hold a different colour
        assert _total_variation(pair.loser) > 3 * _total_variation(pair.winner)
        loser_core = pair.loser[:, core].mean(dim=1)
        assert (loser_core - target.view(3)).abs().max() > 0.2


def test_the_largest_seeds_preflight_allows_draw_pairs():
    # job.seed and synthetic_seed may each be 2**63 - 1; seed * 1_000_003 is then far past torch's 64 bits.
    source = SyntheticPairs(2, MediaSpec.image(16), seed=2 * (2**63 - 1))
    assert source[1].winner.shape == (3, 16, 16)


def test_repeat_reads_are_remembered_copies_with_the_first_values(monkeypatch):
    import cosmos_rl.data.synthetic_pairs as sp

    source, fresh = SyntheticPairs(4, MediaSpec.image(16), seed=5), SyntheticPairs(4, MediaSpec.image(16), seed=5)
    first = source[2]
    first.winner.fill_(0.0)  # a caller writing into what it was given
    first.loser.fill_(0.0)
    again = source[2]
    reference = fresh._generate(2)  # painted anew, no memo involved
    assert again.winner is not first.winner
    assert torch.equal(again.winner, reference.winner) and torch.equal(again.loser, reference.loser)
    assert len(source._memo) == 1
    # A bound of one pair: reads evict each other, and every read still gives the painted values.
    monkeypatch.setattr(sp, "MEMO_BYTES", reference.winner.nbytes + reference.loser.nbytes)
    bounded = SyntheticPairs(4, MediaSpec.image(16), seed=5)
    for index in (0, 1, 0, 3, 1):
        pair, painted = bounded[index], fresh._generate(index)
        assert torch.equal(pair.winner, painted.winner) and torch.equal(pair.loser, painted.loser)
        assert list(bounded._memo) == [index]


def test_pickle_carries_no_remembered_pixels():
    import pickle

    source = SyntheticPairs(3, MediaSpec.image(8), seed=1)
    [source[i] for i in range(3)]
    copy = pickle.loads(pickle.dumps(source))
    assert len(source._memo) == 3 and not copy._memo and copy._memo_bytes == 0
    assert torch.equal(copy[1].loser, source[1].loser)
