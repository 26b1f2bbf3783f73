"""How a dead actor is reported: the cause the actor raised, not Ray's generic first sentence."""

import pytest

from cosmos_rl.dist.addresses import is_loopback
from cosmos_rl.dist.ray_group import _cause_line


def test_the_actors_own_error_line_is_the_cause():
    text = (
        "The actor died because of an error raised in its creation task, ray::NFTWorker.__init__()\n"
        '  File "worker.py", line 3, in __init__\n'
        "    raise ValueError('first')\n"
        "ValueError: first\n"
        "\nDuring handling of the above exception, another exception occurred:\n"
        "cosmos_rl.core.errors.UserError: model.path: folder not found (got \"/x\")\n"
    )
    assert _cause_line(RuntimeError(text)) == 'cosmos_rl.core.errors.UserError: model.path: folder not found (got "/x")'


def test_a_message_without_a_traceback_keeps_its_first_line():
    assert _cause_line(RuntimeError("the node died\nmore")) == "the node died"


_CONNECT = (
    "from cosmos_rl.core import schema\n"
    "from cosmos_rl.dist.ray_group import RayCluster\n"
    "cluster = RayCluster(schema.GridConfig(backend='ray'))\n"
    "try:\n    cluster.connect()\nexcept Exception as exc:\n    print('REFUSED', exc)\n"
    "else:\n    import ray\n    print('NODE', ray.util.get_node_ip_address()); cluster.shutdown()\n"
)


def _python(code: str, cwd) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    env["RAY_AUTH_MODE"] = "disabled"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=cwd)
    return out.stdout + out.stderr[-2000:]


@pytest.mark.slow
def test_a_local_cluster_started_by_the_tool_stays_on_loopback(tmp_path):
    """Without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER in the environment Ray binds the host's address;
    the tool sets it before importing Ray, so a local cluster lives on 127.0.0.1."""
    assert "NODE 127.0.0.1" in _python(_CONNECT, tmp_path)


@pytest.mark.slow
def test_a_cluster_bound_off_loopback_is_refused(tmp_path):
    """Ray imported before the tool could set the variable binds the address Ray's own lookup
    gives for this host; the tool then refuses, naming it. The lookup is printed first (it sends
    no packet), so the expected outcome is known, not guessed: a host whose only address is
    loopback gets a loopback cluster, and is not refused."""
    late = (
        "import ray\n"
        "from ray._private.services import get_node_ip_address\n"
        "print('EXPECT', get_node_ip_address())\n" + _CONNECT
    )
    out = _python(late, tmp_path)
    expected = out.split("EXPECT ", 1)[1].split()[0]
    if is_loopback(expected):
        assert f"NODE {expected}" in out, out
    else:
        assert f"REFUSED the local Ray cluster would bind {expected}, not 127.0.0.1" in out, out
