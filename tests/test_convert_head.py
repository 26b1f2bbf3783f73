"""`reward convert-head` on what a published .pth may hold and where it may be asked to write: one
line each, exit 2, naming the file, the key and what was found; never a traceback."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _reward_models import head_state
from cosmos_rl import cli
from cosmos_rl.core.errors import UserError, library_text
from cosmos_rl.rewards.models import convert_head


def _run(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        cli.app(["reward", "convert-head", *map(str, args)])
    return info.value.code, capsys.readouterr().err


def _weight():
    return head_state(0)["layers.0.weight"]


BAD_STATES = [
    ("int keys", lambda: {0: _weight()}, r"has key 0 \(of type int\); a state dict's keys are tensor names"),
    ("meta tensor", lambda: {"weight": torch.empty(1, 8, device="meta"), "bias": torch.zeros(1)},
     r"has 'weight' on the meta device \(a shape without values\)"),
    ("sparse tensor", lambda: {"weight": torch.ones(1, 8).to_sparse(), "bias": torch.zeros(1)},
     r"has 'weight' as a sparse_coo tensor; only dense tensors are heads"),
    ("a list, not a tensor", lambda: {"weight": [1.0], "bias": torch.zeros(1)}, r"has 'weight' holding a list, not a tensor"),
    ("not a dict", lambda: [torch.zeros(1)], r"holds a list, not a state dict"),
]


@pytest.mark.parametrize("name, state, expected", BAD_STATES, ids=[c[0] for c in BAD_STATES])
def test_a_state_dict_that_is_no_head_is_refused_naming_the_key(tmp_path, capsys, name, state, expected):
    torch.save(state(), tmp_path / "head.pth")
    target = tmp_path / "aesthetic_head.safetensors"
    rc, err = _run(capsys, tmp_path / "head.pth", target)
    assert rc == 2 and "Traceback" not in err
    line = " ".join(err.split())  # rich wraps long lines at the console width
    assert f"{str(tmp_path / 'head.pth')!r}" in line
    assert re.search(expected, line), line
    assert "got dict" not in line
    assert not target.exists()


def test_tensors_sharing_storage_are_written_as_copies(tmp_path):
    weight = torch.randn(1, 8)
    torch.save({"weight": weight, "bias": weight[0, :1]}, tmp_path / "head.pth")  # bias is a view into weight
    target = tmp_path / "aesthetic_head.safetensors"
    assert convert_head(tmp_path / "head.pth", target) == ["bias", "weight"]
    back = load_file(str(target))
    assert torch.equal(back["weight"], weight) and torch.equal(back["bias"], weight[0, :1])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging file left behind


def test_the_file_gets_the_users_umask_not_0600(tmp_path):
    torch.save(head_state(0), tmp_path / "head.pth")
    old = os.umask(0o022)
    try:
        convert_head(tmp_path / "head.pth", tmp_path / "aesthetic_head.safetensors")
    finally:
        os.umask(old)
    assert (tmp_path / "aesthetic_head.safetensors").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    "source, expected",
    [
        ("/dev/zero", r"'/dev/zero': not a regular file \(a folder, device or pipe\)"),
        ("missing.pth", r"missing.pth': file not found"),
        ("folder", r"folder': not a regular file"),
    ],
)
def test_a_source_that_is_no_file_is_named_for_what_it_is(tmp_path, capsys, source, expected):
    (tmp_path / "folder").mkdir()
    path = source if source.startswith("/") else tmp_path / source
    rc, err = _run(capsys, path, tmp_path / "aesthetic_head.safetensors")
    assert rc == 2 and "Traceback" not in err
    assert re.search(expected, " ".join(err.split()))


@pytest.mark.parametrize(
    "target, expected",
    [
        ("folder", r"is a folder; give the file to write, e.g. '.*aesthetic_head.safetensors'"),
        ("/proc/cosmos-rl-test/aesthetic_head.safetensors", r"cannot be written \("),
        ("head.bin", r"does not end in .safetensors"),
    ],
)
def test_a_target_that_cannot_be_a_head_file_is_refused(tmp_path, capsys, target, expected):
    torch.save(head_state(0), tmp_path / "head.pth")
    (tmp_path / "folder").mkdir()
    path = target if target.startswith("/") else tmp_path / target
    rc, err = _run(capsys, tmp_path / "head.pth", path)
    assert rc == 2 and "Traceback" not in err
    assert re.search(expected, " ".join(err.split())), err


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_pickle_that_needs_code_names_the_global_without_torchs_colour_codes(tmp_path, capsys):
    torch.save({"layers.0.weight": _Payload()}, tmp_path / "evil.pth")
    with pytest.raises(UserError) as error:
        convert_head(tmp_path / "evil.pth", tmp_path / "aesthetic_head.safetensors")
    message = str(error.value)
    assert "\x1b" not in message and "\n" not in message
    assert "Unsupported global: __builtin__.print)" in message  # protocol 2 names builtins so
    assert "weights_only` set to `False`" not in message  # torch's advice to run the file's code is not repeated
    assert "this must never run" not in capsys.readouterr().out


def test_library_text_drops_terminal_codes_and_escapes_control_characters():
    assert library_text(RuntimeError("\x1b[1mbold\x1b[0m and\n\tmore\x07")) == "bold and more\\x07"
    assert library_text(RuntimeError("")) == "RuntimeError"
    assert library_text(RuntimeError("x" * 500), limit=10) == "xxxxxxx..."
