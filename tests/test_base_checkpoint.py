"""Base-checkpoint resolution (local, DCP, s3:// via a real moto server) and strict loading."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from _s3_server import CREDENTIALS, CountingS3Server

from cosmos_rl.checkpoint.collective import quiet_single_process
from cosmos_rl.core.errors import UserError
from cosmos_rl.models.base_checkpoint import load_base_weights, resolve_init_from


class Trunk(torch.nn.Module):
    """Stands in for the T2I transformer; ``with_heads`` adds what a Nano base also carries."""

    def __init__(self, seed: int, with_heads: bool = False):
        super().__init__()
        torch.manual_seed(seed)
        self.proj = torch.nn.Linear(4, 4)
        self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        if with_heads:
            self.audio_proj_in = torch.nn.Linear(3, 4)
            self.audio_modality_embed = torch.nn.Parameter(torch.randn(4))
            self.action_proj_out = torch.nn.Linear(4, 2)


def diffusers_folder(root, state: dict, shards: int = 1):
    """What save_pretrained writes for a transformer: transformer/*.safetensors (+ index)."""
    folder = root / "transformer"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    keys = sorted(state)
    if shards == 1:
        save_file({k: state[k].contiguous() for k in keys}, folder / "diffusion_pytorch_model.safetensors")
        return root
    weight_map = {}
    for i in range(shards):
        name = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i::shards]
        save_file({k: state[k].contiguous() for k in part}, folder / name)
        weight_map.update({k: name for k in part})
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def same_trunk(a: torch.nn.Module, b: torch.nn.Module):
    sb = b.state_dict()
    for key, value in a.state_dict().items():
        assert torch.equal(value, sb[key]), key


HEADS = ["audio_*", "action_*"]


@pytest.mark.parametrize("shards", [1, 2])
def test_diffusers_folder_loads_trunk_and_skips_heads(tmp_path, shards):
    base = Trunk(seed=0, with_heads=True)
    folder = diffusers_folder(tmp_path / "base", base.state_dict(), shards)
    model = Trunk(seed=1)
    assert resolve_init_from(str(folder), tmp_path / "cache") == folder.resolve()
    load_base_weights(model, folder, HEADS)
    same_trunk(model, base)


def test_extra_heads_without_skip_list_fail_naming_keys_and_settings(tmp_path):
    folder = diffusers_folder(tmp_path / "base", Trunk(seed=0, with_heads=True).state_dict())
    model = Trunk(seed=1)
    before = model.proj.weight.clone()
    with pytest.raises(UserError) as err:
        load_base_weights(model, folder, [])
    msg = str(err.value)
    assert "rl.init_from" in msg and "rl.init_keys_to_skip_loading" in msg
    assert "5 key(s) in the base that the model does not build" in msg
    assert "action_proj_out.bias" in msg and "audio_modality_embed" in msg
    assert torch.equal(model.proj.weight, before)  # nothing was loaded


def test_dcp_folder_loads_and_reports_missing_and_mismatched_keys(tmp_path):
    base = Trunk(seed=0, with_heads=True)
    with quiet_single_process():
        dcp.save(base.state_dict(), checkpoint_id=str(tmp_path / "dcp"))
    model = Trunk(seed=1)
    load_base_weights(model, resolve_init_from(str(tmp_path / "dcp"), tmp_path / "cache"), HEADS)
    same_trunk(model, base)

    wider = Trunk(seed=1)
    wider.blocks[0] = torch.nn.Linear(4, 5)
    wider.blocks[1] = torch.nn.LayerNorm(5)
    wider.extra = torch.nn.Linear(2, 2)
    with pytest.raises(UserError) as err:
        load_base_weights(wider, tmp_path / "dcp", HEADS)
    msg = str(err.value)
    assert "2 model key(s) absent from the base: extra.bias, extra.weight" in msg
    assert "blocks.0.weight (base (4, 4), model (5, 4))" in msg


def test_skip_pattern_matching_nothing_is_an_error(tmp_path):
    folder = diffusers_folder(tmp_path / "base", Trunk(seed=0, with_heads=True).state_dict())
    with pytest.raises(UserError, match=r"'audio_' matches no key.*'audio_\*' would match 3 keys"):
        load_base_weights(Trunk(seed=1), folder, ["audio_", "action_*"])
    with pytest.raises(UserError, match=r"'sound_head\.\*' matches no key"):
        load_base_weights(Trunk(seed=1), folder, [*HEADS, "sound_head.*"])


def test_skip_pattern_dropping_a_needed_key_is_reported(tmp_path):
    folder = diffusers_folder(tmp_path / "base", Trunk(seed=0, with_heads=True).state_dict())
    with pytest.raises(UserError, match=r"absent from the base: proj\.bias, proj\.weight; 2 of them dropped by rl\.init_keys_to_skip_loading"):
        load_base_weights(Trunk(seed=1), folder, [*HEADS, "proj.*"])


def test_bad_local_values(tmp_path):
    with pytest.raises(UserError, match="rl.init_from: .*nope does not exist"):
        resolve_init_from(str(tmp_path / "nope"), tmp_path / "cache")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README").write_text("x")
    with pytest.raises(UserError, match=r"neither a diffusers folder.*README"):
        resolve_init_from(str(tmp_path / "empty"), tmp_path / "cache")
    with pytest.raises(UserError, match="unsupported URL"):
        resolve_init_from("gs://bucket/x", tmp_path / "cache")
    with pytest.raises(UserError, match="no bucket"):
        resolve_init_from("s3:///x", tmp_path / "cache")


def test_cosmos3_transformer_with_sound_and_action_heads(tmp_path):
    from diffusers import Cosmos3OmniTransformer

    config = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, latent_channel=4, latent_patch_size=2,
        patch_latent_dim=16, rope_axes_dim=[4, 2, 2], vocab_size=300, dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    nano = Cosmos3OmniTransformer(**config, sound_gen=True, sound_dim=8, action_gen=True, action_dim=6)
    nano.save_pretrained(tmp_path / "nano" / "transformer")
    torch.manual_seed(1)
    t2i = Cosmos3OmniTransformer(**config)

    with pytest.raises(UserError, match=r"10 key\(s\) in the base that the model does not build: action_modality_embed"):
        load_base_weights(t2i, resolve_init_from(str(tmp_path / "nano"), tmp_path / "cache"), [])
    load_base_weights(t2i, tmp_path / "nano", ["audio_*", "action_*"])
    nano_state = nano.state_dict()
    for key, value in t2i.state_dict().items():
        assert torch.equal(value, nano_state[key]), key


# --------------------------------------------------------------------------- s3


@pytest.fixture
def s3_server():
    server = CountingS3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(monkeypatch, tmp_path, s3_server):
    """A real moto S3 server on loopback with dummy credentials; yields (client, endpoint, stop)."""
    import boto3

    for name, value in {
        **CREDENTIALS,
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    client.create_bucket(Bucket="bases")
    return client, s3_server.endpoint, s3_server.stop


def cached_folders(cache) -> list[str]:
    """What a failed pull left in the cache besides the (harmless, reused) lock files."""
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith(".lock-"))


def upload(client, folder, prefix):
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), "bases", f"{prefix}/{path.relative_to(folder).as_posix()}")


def test_s3_is_pulled_once_and_reused_without_requests(tmp_path, s3):
    client, endpoint, stop = s3
    base = Trunk(seed=0, with_heads=True)
    upload(client, diffusers_folder(tmp_path / "base", base.state_dict(), shards=2), "nano/v1")
    client.put_object(Bucket="bases", Key="nano/v10/other.txt", Body=b"not ours")  # same string prefix

    cache = tmp_path / "cache"
    local = resolve_init_from("s3://bases/nano/v1", cache, endpoint_url=endpoint)
    assert local.parent == cache.resolve()
    pulled = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert pulled == sorted(
        p.relative_to(tmp_path / "base").as_posix() for p in (tmp_path / "base").rglob("*") if p.is_file()
    )
    model = Trunk(seed=1)
    load_base_weights(model, local, HEADS)
    same_trunk(model, base)

    stop()  # any S3 request from now on fails
    assert resolve_init_from("s3://bases/nano/v1/", cache, endpoint_url=endpoint) == local
    with pytest.raises(UserError, match="cannot pull s3://bases/other"):
        resolve_init_from("s3://bases/other", cache, endpoint_url=endpoint)


def test_s3_endpoint_from_environment_and_empty_prefix(tmp_path, s3, monkeypatch):
    client, endpoint, _ = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(UserError, match=r"no objects under s3://bases/missing"):
        resolve_init_from("s3://bases/missing", tmp_path / "cache")
    assert cached_folders(tmp_path / "cache") == []


def test_s3_crash_mid_download_leaves_no_usable_cache(tmp_path, s3, monkeypatch):
    client, endpoint, _ = s3
    upload(client, diffusers_folder(tmp_path / "base", Trunk(seed=0).state_dict(), shards=2), "t2i")
    import boto3

    calls = {"n": 0}
    real_client = boto3.client

    def flaky_client(*args, **kwargs):
        inner = real_client(*args, **kwargs)
        real_download = inner.download_file

        def download_file(bucket, key, dest):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt  # the job is killed half-way through the pull
            return real_download(bucket, key, dest)

        inner.download_file = download_file
        return inner

    monkeypatch.setattr("boto3.client", flaky_client)
    with pytest.raises(KeyboardInterrupt):
        resolve_init_from("s3://bases/t2i", tmp_path / "cache", endpoint_url=endpoint)
    assert cached_folders(tmp_path / "cache") == []

    # A process killed outright leaves its .partial- directory behind; it is never used.
    stale = tmp_path / "cache" / ".partial-deadbeef-0000"
    (stale / "transformer").mkdir(parents=True)
    (stale / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"half")

    monkeypatch.setattr("boto3.client", real_client)
    local = resolve_init_from("s3://bases/t2i", tmp_path / "cache", endpoint_url=endpoint)
    assert not local.name.startswith(".partial-")
    model = Trunk(seed=1)
    load_base_weights(model, local, [])
    same_trunk(model, Trunk(seed=0))


def test_concurrent_pulls_on_one_node_download_each_object_once(tmp_path, s3, s3_server):
    # Three processes (the ranks of one node) ask for the same base at once; the first to take the
    # cache's lock downloads, the others wait and reuse its copy. The test holds the lock while they
    # start, so all three are waiting together; slow GETs keep any unlocked download overlapping.
    import multiprocessing

    from cosmos_rl.models.layout import s3_cache_dir
    from cosmos_rl.models.s3_cache import _exclusive, lock_path, pull_once

    client, endpoint, _ = s3
    upload(client, diffusers_folder(tmp_path / "base", Trunk(seed=0).state_dict(), shards=2), "nano")
    objects = {f"bases/nano/{p.relative_to(tmp_path / 'base').as_posix()}" for p in (tmp_path / "base").rglob("*") if p.is_file()}
    s3_server.get_delay_s = 0.2
    cache = tmp_path / "cache"
    target = s3_cache_dir("s3://bases/nano", cache)
    cache.mkdir()
    spawn = multiprocessing.get_context("spawn")
    with _exclusive(lock_path(target)):
        ranks = [spawn.Process(target=pull_once, args=("s3://bases/nano", str(cache), endpoint)) for _ in range(3)]
        for rank in ranks:
            rank.start()
        import time

        time.sleep(1.0)  # let every rank reach the lock
    for rank in ranks:
        rank.join(timeout=120)
    assert [rank.exitcode for rank in ranks] == [0, 0, 0]
    assert s3_server.object_gets() == {key: 1 for key in objects}
    model = Trunk(seed=1)
    load_base_weights(model, resolve_init_from("s3://bases/nano", cache), [])
    same_trunk(model, Trunk(seed=0))


def test_s3_errors_name_the_url_not_the_cache(tmp_path, s3):
    client, endpoint, _ = s3
    client.put_object(Bucket="bases", Key="junk/README", Body=b"not a checkpoint")
    cache = tmp_path / "cache"
    with pytest.raises(UserError) as error:
        resolve_init_from("s3://bases/junk", cache, endpoint_url=endpoint)
    assert "rl.init_from: s3://bases/junk is neither" in str(error.value) and str(cache) not in str(error.value)

    upload(client, diffusers_folder(tmp_path / "base", Trunk(seed=0, with_heads=True).state_dict()), "nano")
    local = resolve_init_from("s3://bases/nano", cache, endpoint_url=endpoint)
    with pytest.raises(UserError) as error:
        load_base_weights(Trunk(seed=1), local, [], shown_as="s3://bases/nano")
    message = str(error.value)
    assert message.startswith("rl.init_from: base checkpoint s3://bases/nano does not match") and str(cache) not in message
