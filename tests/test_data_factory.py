import itertools
import textwrap

import pytest
import torch

from cosmos_rl.data.factory_spec import exposes_membership, resolve_factory
from cosmos_rl.data.pairs import PreferencePair, factory_source
from cosmos_rl.core.errors import UserError
from cosmos_rl.core.media import MediaSpec

_counter = itertools.count()
IMAGE = MediaSpec.image(4)  # an image run of the records' 4x4 size

_WITH_MEMBERSHIP = """
import torch
from cosmos_rl.data.pairs import PreferencePair

class Pairs:
    def __init__(self, n, fill=0.5):
        self.n, self.fill = n, fill
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return PreferencePair(f"x{i}", "p", torch.full((3, 4, 4), self.fill), torch.zeros(3, 4, 4))
    def membership_ids(self):
        return [f"x{i}" for i in range(self.n)]

def make(n, fill=0.5) -> Pairs:
    return Pairs(n, fill)

def make_unannotated(n):
    return Pairs(n)

class NoMembership:
    def __len__(self):
        return 1
    def __getitem__(self, i):
        return PreferencePair("y", "p", torch.ones(3, 4, 4), torch.zeros(3, 4, 4))

def make_plain():
    return NoMembership()

def make_list():
    return 42

def make_bad_items():
    return [("not", "a", "pair")]

def make_out_of_range():
    return [PreferencePair("z", "p", torch.full((3, 4, 4), 2.0), torch.zeros(3, 4, 4))]

NOT_CALLABLE = 3
"""


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A fresh importable module (unique name, so no import cache is shared between tests)."""
    name = f"user_pairs_{next(_counter)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_WITH_MEMBERSHIP))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _exposes(spec: str) -> bool:
    """What preflight asks of a factory, by importing only."""
    return exposes_membership(resolve_factory(spec, "rl.data.factory"))


def test_factory_builds_a_checked_source_with_kwargs(module):
    source = factory_source(f"{module}:make", IMAGE, n=3, fill=0.25)
    assert len(source) == 3
    pair = source[2]
    assert isinstance(pair, PreferencePair) and pair.id == "x2"
    assert torch.equal(pair.winner, torch.full((3, 4, 4), 0.25))
    assert source.membership_ids() == ["x0", "x1", "x2"]


def test_class_target_works_too(module):
    assert factory_source(f"{module}:Pairs", IMAGE, n=2).membership_ids() == ["x0", "x1"]


def test_membership_is_detected_by_import_only(module):
    assert _exposes(f"{module}:make") is True
    assert _exposes(f"{module}:Pairs") is True
    assert _exposes(f"{module}:NoMembership") is False
    assert _exposes(f"{module}:make_unannotated") is False
    assert _exposes(f"{module}:make_plain") is False


def test_source_without_membership_fails_only_when_membership_is_asked(module):
    source = factory_source(f"{module}:make_plain", IMAGE)
    assert source[0].id == "y"
    with pytest.raises(UserError, match=r"rl\.data\.factory: .*without membership_ids\(\)"):
        source.membership_ids()


@pytest.mark.parametrize(
    "spec_suffix, message",
    [
        (":", "not of the form 'module:function'"),
        ("", "not of the form 'module:function'"),
        (":missing", "has no attribute 'missing'"),
        (":NOT_CALLABLE", "is a int, not a function or class"),
        (":make_list", "lacks __len__, __getitem__"),
    ],
)
def test_bad_factories_name_rl_data_factory(module, spec_suffix, message):
    with pytest.raises(UserError, match=r"rl\.data\.factory") as raised:
        factory_source(f"{module}{spec_suffix}", IMAGE)
    assert message in str(raised.value)


def test_unknown_module_and_module_that_fails_to_import(tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"rl\.data\.factory: module 'no_such_mod_xyz' not found"):
        factory_source("no_such_mod_xyz:make", IMAGE)
    (tmp_path / "broken_pairs_mod.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=r"importing 'broken_pairs_mod' failed: RuntimeError: boom"):
        _exposes("broken_pairs_mod:make")


def test_malformed_records_fail_naming_factory_and_index(module):
    expected = r"rl\.data\.factory '.*:make_bad_items' index 0: expected a PreferencePair"
    with pytest.raises(UserError, match=expected):
        factory_source(f"{module}:make_bad_items", IMAGE)[0]
    with pytest.raises(UserError, match=r"index 0 \(id 'z'\): winner values span \[2, 2\]"):
        factory_source(f"{module}:make_out_of_range", IMAGE)[0]
