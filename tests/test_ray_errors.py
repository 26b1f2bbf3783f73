"""How a dead actor is reported: the cause the actor raised, not Ray's generic first sentence."""

from cosmos_rl.dist.ray_group import _cause_line


def test_the_actors_own_error_line_is_the_cause():
    text = (
        "The actor died because of an error raised in its creation task, ray::NFTWorker.__init__()\n"
        '  File "worker.py", line 3, in __init__\n'
        "    raise ValueError('first')\n"
        "ValueError: first\n"
        "\nDuring handling of the above exception, another exception occurred:\n"
        "cosmos_rl.errors.UserError: model.path: folder not found (got \"/x\")\n"
    )
    assert _cause_line(RuntimeError(text)) == 'cosmos_rl.errors.UserError: model.path: folder not found (got "/x")'


def test_a_message_without_a_traceback_keeps_its_first_line():
    assert _cause_line(RuntimeError("the node died\nmore")) == "the node died"


def test_a_local_cluster_started_by_the_tool_stays_on_loopback(tmp_path):
    """Without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER in the environment Ray binds the host's address;
    the tool sets it before importing Ray, so a local cluster lives on 127.0.0.1."""
    import os
    import subprocess
    import sys

    code = (
        "import ray\n"
        "from cosmos_rl.config import schema\n"
        "from cosmos_rl.dist.ray_group import RayCluster\n"
    )
    # `import ray` first would be too late for Ray's own constants: the guard must then refuse.
    late = code + (
        "cluster = RayCluster(schema.GridConfig(backend='ray'))\n"
        "try:\n    cluster.connect()\nexcept Exception as exc:\n    print('REFUSED', exc)\n"
        "else:\n    print('NODE', ray.util.get_node_ip_address()); cluster.shutdown()\n"
    )
    early = late.replace("import ray\n", "", 1).replace("cluster.connect()", "cluster.connect(); import ray", 1)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    env["RAY_AUTH_MODE"] = "disabled"
    out = subprocess.run([sys.executable, "-c", early], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert "NODE 127.0.0.1" in out.stdout, out.stdout + out.stderr[-2000:]
    # Imported too early, Ray binds the host's address (on a host that has one): the run refuses.
    out = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert "REFUSED the local Ray cluster bound" in out.stdout or "NODE 127." in out.stdout, out.stdout + out.stderr[-2000:]
