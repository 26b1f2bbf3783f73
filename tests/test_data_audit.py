import pytest

from cosmos_rl.data.audit import leakage_audit
from cosmos_rl.core.errors import UserError


def test_disjoint_ids_pass():
    leakage_audit(["a", "b"], ["c", "d"])


def test_overlap_lists_count_and_first_examples():
    train = [f"id{i}" for i in range(10)]
    val = ["new", "id9", "id1", "id1", "id2", "id3", "id4", "id5", "id6"]
    with pytest.raises(UserError) as raised:
        leakage_audit(train, val, max_examples=5)
    message = str(raised.value)
    assert message.startswith("rl.validation: 7 validation id(s)")
    assert "'id9', 'id1', 'id2', 'id3', 'id4' and 2 more" in message
    assert "'id5'" not in message and "'new'" not in message


def test_small_overlap_has_no_more_suffix():
    with pytest.raises(UserError, match=r"1 validation id\(s\) .*\('b'\); point rl\.validation"):
        leakage_audit(iter(["a", "b"]), iter(["b", "z"]))
