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


# ------------------------------------------------------------------------ the fuzz: every subcommand's options
HOSTILE = ["", "-1", "0", str(2**63), str(10**30), "nan", "inf", "1e308", "x" * 300, "a\x00b", "\udcff", "[[[[", "../../..", "preset:nope"]
# (the command's words, its options that take a value, fixed arguments that make it refuse before
# any model loads or any server listens, so the fuzz stays fast and starts nothing)
COMMANDS = [
    (["validate", NFT], ["--data"], []),
    (["plan", NFT], [], ["rl.max_steps=0"]),
    (["compare", "/nonexistent_run"], ["--out", "--base-eval", "--base-score", "--margin"], []),
    (["eval", "/nonexistent_target"], ["--prompts", "--seeds", "--per-task", "--suite", "--reward", "--batch-size", "--image-size",
                                       "--out", "--device", "--sample-steps", "--guidance", "--step", "--frames", "--condition"], []),
    (["export", "/nonexistent_run"], ["--out", "--step"], []),
    (["report", "/nonexistent_run"], ["--out"], []),
    (["reward", "serve", "--revision", ""], ["--host", "--port", "--token-env", "--model", "--replicas", "--cpus-per-replica",
                                              "--gpus-per-replica", "--ray-address"], []),
    (["pairs", "mine", "/nonexistent_target", "--prompts", "/nonexistent.txt"], ["--reward", "--samples", "--out", "--seed",
                                                                                  "--batch-size", "--per-shard", "--device", "--sample-steps", "--guidance", "--step", "--frames", "--frame-reduce"], []),
]  # fmt: skip


def test_every_subcommands_options_exit_0_1_2_or_75_and_never_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything a command writes lands here
    for words, options, fixed in COMMANDS:
        for option in options:
            for value in HOSTILE:
                args = [*words, option, value, *fixed]
                if words[0] == "pairs" and option != "--reward":
                    args += ["--reward", "shapes_strict"]
                if words[0] in ("pairs", "export") and option != "--out":
                    args += ["--out", str(tmp_path / "o")]
                result = CliRunner().invoke(app, args)
                assert result.exit_code in (0, 1, 2, 75), (args, result.exit_code, result.output)
                assert "Traceback" not in result.output, (args, result.output)
                assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
