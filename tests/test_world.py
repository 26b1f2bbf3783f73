"""Process-group plumbing: a single-host world meets through a file, opening no store socket."""

import torch
import torch.distributed as dist

from cosmos_rl.dist import world
from cosmos_rl.dist.ray_group import is_loopback, store_file_for


def test_a_store_file_rendezvous_opens_no_tcp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    world.init_process_group(torch.device("cpu"), 0, 1, 30.0, store_file=str(tmp_path / "store"))
    try:
        store = dist.distributed_c10d._get_default_store()
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        assert isinstance(store, dist.FileStore) and not isinstance(store, dist.TCPStore)
        tensor = torch.ones(2)
        dist.all_reduce(tensor)
        assert tensor.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_store_files_are_per_port_and_only_loopback_counts_as_one_host():
    assert store_file_for(1234) != store_file_for(1235)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.2") and not is_loopback("node-3")
