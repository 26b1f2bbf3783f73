"""Context parallelism (dist/context_parallel.py, models/packing.set_context_parallel) gives the
one-rank velocities and parameter gradients, on groups of 2 and of 4 CPU ranks.

One torchrun world of 4 gloo ranks (tests/_context_parallel_worker.py) runs every case on the
whole world (a group of 4) and on two groups of 2, against the same forward without context
parallelism in the same process. The tiny preset has 4 attention heads and 2 KV heads: a group of
2 splits the KV heads, a group of 4 repeats them first.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos_rl.dist.context_parallel import ContextParallel
from cosmos_rl.models.build import build_preset
from cosmos_rl.models.packing import context_parallel_of, set_context_parallel

REPO = Path(__file__).resolve().parents[1]
CASES = ("t2v", "i2v", "action", "action_checkpointed")
SIZES = (2, 4)


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("cp") / "results.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",  # keep gloo traffic on loopback
        "PYTHONWARNINGS": "ignore::UserWarning",
    }
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4",
        "--master_addr=127.0.0.1", f"--master_port={_free_loopback_port()}",
        str(REPO / "tests" / "_context_parallel_worker.py"), str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == 4
    return results


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", CASES)
def test_velocities_and_gradients_equal_the_one_rank_computation(ranks, case, size):
    for rank, results in enumerate(ranks):
        result = results[f"{case}/{size}"]
        where = f"rank {rank}, {case} on {size} ranks"
        assert result["velocity_diff"] <= 1e-6, where
        assert result["grad_keys_match"], where
        assert result["grad_diff"] <= 1e-6, where
        # Not vacuous: real gradients on every weight that shapes the output (text tower included).
        assert result["grad_max"] > 1e-3 and result["grad_count"] >= 55, where
        # The action cases return the action velocity too, and their heads get gradients.
        if case.startswith("action"):
            assert result["outputs"] == 2 and result["grad_count"] > 55, where
        else:
            assert result["outputs"] == 1, where
        # Each rank really held 1/size of the batch's vision (+ action) rows: 2 samples of 48 (+4).
        per_sample = 52 if case.startswith("action") else 48
        assert result["local_rows"] == 2 * per_sample // size, where


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_a_token_count_that_does_not_split_names_the_key_and_the_fix(ranks, size):
    for results in ranks:
        message = results[f"odd/{size}"]
        assert f"17 vision/action tokens of this batch do not split over grid.context_parallel = {size}" in message


def test_heads_that_do_not_split_are_refused_before_any_forward():
    transformer = build_preset("tiny", seed=0).transformer  # 4 attention heads
    with pytest.raises(ValueError, match="4 attention heads do not split over 3 .*grid.context_parallel"):
        set_context_parallel(transformer, ContextParallel(group=None, rank=0, size=3))
    assert context_parallel_of(transformer) is None


def test_a_group_of_one_is_no_context_parallelism():
    transformer = build_preset("tiny", seed=0).transformer
    set_context_parallel(transformer, ContextParallel(group=None, rank=0, size=1))
    assert context_parallel_of(transformer) is None
    set_context_parallel(transformer, ContextParallel(group=None, rank=0, size=2))
    assert context_parallel_of(transformer).size == 2
    set_context_parallel(transformer, None)
    assert context_parallel_of(transformer) is None
