"""The reward service under load and hostile input: each case stays up, bounded, with the right status."""

from __future__ import annotations

import functools
import json
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from base64 import b64encode
from pathlib import Path

import numpy as np
import pytest
import requests
from typer.testing import CliRunner

from cosmos_rl.cli import app
from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards.client import RewardClient, encode_png
from cosmos_rl.rewards.functions import brightness
from cosmos_rl.rewards.limits import Limits
from cosmos_rl.rewards.registry import Reward, builtin_rewards
from cosmos_rl.rewards.server import RewardServer, check_exposure, serve_forever_cli

REPO = Path(__file__).resolve().parents[1]
REVISION = "hostile-1"


@functools.lru_cache(maxsize=None)
def _png_of_zeros(side: int) -> str:
    """A valid side x side RGB PNG of zeros, row by row (12000 gives ~420 KB that decodes to 432 MB)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    z = zlib.compressobj(9)
    row = b"\x00" * (1 + side * 3)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b64encode(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")).decode()


def _body(images: list[str], reward: str = "brightness") -> dict:
    return {"reward": reward, "prompts": ["a"] * len(images), "images": images}


def _peak_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (FIN, or RST over bytes it never read)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    return data


@pytest.fixture(scope="module")
def service():
    """`cosmos-rl reward serve` in a subprocess, so its peak memory is its own."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cosmos_rl.cli", "reward", "serve", "--revision", REVISION, "--port", "0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = proc.stdout.readline().split("listening on ")[1].split()[0]
        yield proc, url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_decompression_bomb_is_refused_from_its_header_with_bounded_memory(service):
    proc, url = service
    bomb = _png_of_zeros(12000)
    assert len(bomb) * 3 / 4 < 450_000  # a few hundred KB on the wire ...
    before = _peak_kb(proc.pid)
    for count in (1, 3):
        answer = requests.post(url + "/score", json=_body([bomb] * count), timeout=30)
        assert answer.status_code == 413, answer.text
        assert "12000x12000" in answer.json()["error"] and "images[0]" in answer.json()["error"]
    # ... and 432 MB each once decoded; the service's peak grew by far less than one of them.
    assert (_peak_kb(proc.pid) - before) < 64 * 1024
    ok = requests.post(url + "/score", json=_body([encode_png(np.full((8, 8, 3), 51, np.uint8))]), timeout=30)
    assert ok.status_code == 200 and ok.json()["scores"] == [0.2]


def test_a_bomb_frame_in_a_clip_is_refused_from_its_header_with_bounded_memory(service):
    """The built-in clip reward's scorer is never reached: the frame's header is refused first."""
    proc, url = service
    small = encode_png(np.zeros((32, 32, 3), np.uint8))
    before = _peak_kb(proc.pid)
    body = {"reward": "shapes_video_strict", "prompts": ["a red circle moving left"], "clips": [[small, _png_of_zeros(12000), small]]}
    answer = requests.post(url + "/score", json=body, timeout=30)
    assert answer.status_code == 413, answer.text
    assert "clips[0][1] is 12000x12000" in answer.json()["error"]
    assert (_peak_kb(proc.pid) - before) < 64 * 1024


@pytest.mark.parametrize("limits, images, text", [
    (Limits(max_side=64), [np.zeros((8, 80, 3), np.uint8)], "over the side limit of 64"),
    (Limits(max_pixels=100), [np.zeros((8, 16, 3), np.uint8)], "128 pixels, over the limit of 100"),
    (Limits(max_request_pixels=100), [np.zeros((8, 8, 3), np.uint8)] * 2, "128 pixels, over the limit of 100"),
    (Limits(max_images=1), [np.zeros((8, 8, 3), np.uint8)] * 2, "over the limit of 1"),
], ids=["side", "pixels", "request_pixels", "images"])
def test_each_limit_answers_413(limits, images, text):
    with RewardServer(revision=REVISION, limits=limits) as server:
        answer = requests.post(server.url + "/score", json=_body([encode_png(i) for i in images]), timeout=10)
    assert answer.status_code == 413 and text in answer.json()["error"]


def test_unauthenticated_large_body_is_refused_before_it_is_read():
    with RewardServer(revision=REVISION, token="s3cret") as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 209715200\r\n\r\n" + b"x" * (1 << 20))  # 1 MiB of a promised 200 MiB
        answer = _until_closed(sock)  # the service answers and hangs up instead of waiting for 199 MiB more
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"bearer token" in answer
        assert server.score_requests == 0


def test_oversized_declared_body_is_refused_before_it_is_read():
    with RewardServer(revision=REVISION, limits=Limits(max_body_bytes=1000)) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
        answer = _until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 413") and b"over the limit of 1000" in answer


def test_slow_connections_are_cut_and_the_service_keeps_answering():
    limits = Limits(header_timeout_s=0.5, body_timeout_s=0.5)
    with RewardServer(revision=REVISION, limits=limits) as server:
        slow = []
        for _ in range(40):  # half a request line each, never the rest
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        body = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        body.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"rew")  # a body that stalls
        for s in slow:
            assert s.recv(100) == b""  # closed by the service (recv would time out at 10 s otherwise)
            s.close()
        assert _until_closed(body).startswith(b"HTTP/1.1 408")
        client = RewardClient(server.url, "brightness", REVISION, 10, 0, 0.0)
        assert client.score(np.full((1, 4, 4, 3), 51, np.uint8), ["a"]) == [0.2]


def test_64_concurrent_requests_are_all_answered():
    images = [np.full((1, 16, 16, 3), v, np.uint8) for v in range(64)]
    got, errors = {}, []
    with RewardServer(revision=REVISION) as server:
        barrier = threading.Barrier(64)

        def one(i):
            client = RewardClient(server.url, "brightness", REVISION, 30, 0, 0.0)
            barrier.wait()  # every NFT rank posts at the same moment
            try:
                got[i] = client.score(images[i], ["a"])
            except Exception as exc:  # collected: the assertion below names them
                errors.append(repr(exc))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert got == {i: brightness(images[i], ["a"]) for i in range(64)}  # each got its own scores


def test_concurrent_requests_are_batched_into_one_call():
    calls, first_call_started, release = [], threading.Event(), threading.Event()

    def counting(images, prompts):
        calls.append(len(prompts))
        first_call_started.set()
        release.wait(10)  # hold the first batch so the others queue behind it
        return brightness(images, prompts)

    registry = {**builtin_rewards(), "counting": Reward("counting", counting, "counting:1")}
    with RewardServer(revision=REVISION, registry=registry) as server:
        results = []

        def post(v):
            client = RewardClient(server.url, "counting", REVISION, 30, 0, 0.0)
            results.append(client.score(np.full((2, 8, 8, 3), v, np.uint8), ["a", "b"]))

        first = threading.Thread(target=post, args=(0,))
        first.start()
        assert first_call_started.wait(10)
        rest = [threading.Thread(target=post, args=(v,)) for v in (51, 102, 153, 204, 255)]
        for t in rest:
            t.start()
        batcher = server._app._batchers["counting"]
        deadline = time.monotonic() + 10
        while len(batcher._queue) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
        for t in [first, *rest]:
            t.join()
    assert calls == [2, 10]  # the first request alone, then the five that queued as one call
    assert sorted(r[0] for r in results) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_a_request_the_reward_cannot_score_fails_alone_in_its_batch():
    with RewardServer(revision=REVISION) as server:
        ok = RewardClient(server.url, "prompt_colour", REVISION, 10, 0, 0.0)
        red = np.zeros((1, 4, 4, 3), np.uint8)
        red[..., 0] = 255
        answer = requests.post(server.url + "/score", json=_body([encode_png(red[0])], "prompt_colour"), timeout=10)
        assert answer.status_code == 400 and "names no colour" in answer.json()["error"]
        assert ok.score(red, ["red"]) == [1.0]


MALFORMED = {  # name: (body, what the error must say)
    "reward_list": ({"reward": [], "prompts": ["a"], "images": ["x"]}, "reward must be a string"),
    "reward_object": ({"reward": {}, "prompts": ["a"], "images": ["x"]}, "reward must be a string"),
    "reward_null": ({"reward": None, "prompts": ["a"], "images": ["x"]}, "got null"),
    "reward_number": ({"reward": 5, "prompts": ["a"], "images": ["x"]}, "reward must be a string"),
    "prompts_string": ({"reward": "brightness", "prompts": "a", "images": ["x"]}, "prompts must be a list"),
    "prompts_numbers": ({"reward": "brightness", "prompts": [1], "images": ["x"]}, "prompts must be a list"),
    "images_number": ({"reward": "brightness", "prompts": ["a"], "images": 3}, "images must be a list"),
    "images_object": ({"reward": "brightness", "prompts": ["a"], "images": {}}, "images must be a list"),
    "image_number": ({"reward": "brightness", "prompts": ["a"], "images": [7]}, "images[0] must be a base64 string"),
    "image_not_png": ({"reward": "brightness", "prompts": ["a"], "images": [b64encode(b"GIF89a....").decode()]}, "images[0] is not a base64-encoded PNG"),
    "image_truncated": ({"reward": "brightness", "prompts": ["a"], "images": [_png_of_zeros(8)[:60]]}, "images[0]"),
    "count_mismatch": ({"reward": "brightness", "prompts": ["a", "b"], "images": ["x"]}, "1 images but 2 prompts"),
    "missing": ({"reward": "brightness"}, "missing fields ['prompts', 'images']"),
    "body_array": ([1, 2], "body must be a JSON object"),
    "body_string": ("reward", "body must be a JSON object"),
}


@pytest.fixture(scope="module")
def shared():
    with RewardServer(revision=REVISION) as server:
        yield server


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_every_malformed_field_is_a_400_naming_it(name, shared):
    body, text = MALFORMED[name]
    answer = requests.post(shared.url + "/score", json=body, timeout=10)
    assert answer.status_code == 400, answer.text
    assert text in answer.json()["error"], answer.json()
    assert requests.get(shared.url + "/info", timeout=10).status_code == 200  # still serving


def test_not_json_unknown_path_and_method(shared):
    assert requests.post(shared.url + "/score", data=b"{not json", timeout=10).status_code == 400
    missing = requests.get(shared.url + "/nope", timeout=10)
    assert missing.status_code == 404 and "no such endpoint /nope" in missing.json()["error"]
    assert requests.get(shared.url + "/score", timeout=10).status_code == 405


def test_bad_port_and_exposed_host_are_clean_errors():
    with pytest.raises(UserError, match="--port 99999: must be 0-65535"):
        serve_forever_cli("127.0.0.1", 99999, "r")
    result = CliRunner().invoke(app, ["reward", "serve", "--revision", "r", "--port", "99999"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["reward", "serve", "--revision", "r", "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--insecure" in result.output
    check_exposure("0.0.0.0", None, insecure=True)  # the operator said so
    check_exposure("0.0.0.0", "token", insecure=False)
    check_exposure("::1", None, insecure=False)  # loopback needs neither
    with pytest.raises(UserError, match="reachable from other machines"):
        check_exposure("10.1.2.3", None, insecure=False)
    with RewardServer(revision=REVISION) as taken:
        with pytest.raises(UserError, match="cannot listen on 127.0.0.1"):
            serve_forever_cli("127.0.0.1", taken.port, "r")


def test_info_lists_each_rewards_revision(shared):
    info = requests.get(shared.url + "/info", timeout=10).json()
    assert set(info) == {"name", "revision", "rewards", "revisions", "modalities", "uses_prompt", "protocol", "action_rewards"}
    assert info["protocol"] == 2 and info["action_rewards"] == ["pusht_chunk_coverage"]  # protocol 2: rewards that take action rows
    assert info["revision"] == REVISION and info["revisions"]["brightness"] == "brightness:builtin-1"
    assert json.dumps(info)  # plain JSON


@pytest.mark.parametrize("raw, text", [
    (b'{"reward": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"reward": "brightness", "prompts": ["a"], "images": [' + b"7" * 5000 + b"]}", "does not read"),
], ids=["nested_100000", "integer_5000_digits"])  # fmt: skip
def test_deeply_nested_json_and_a_5000_digit_integer_are_a_400_not_a_500(shared, raw, text):
    """A 500 is retried by clients as a service fault; these are the client's own input."""
    answer = requests.post(shared.url + "/score", data=raw, timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    assert text in answer.json()["error"]
    assert requests.get(shared.url + "/info", timeout=10).status_code == 200


def test_error_texts_name_no_object_address_and_cut_a_huge_reward_name(shared):
    not_png = {"reward": "brightness", "prompts": ["a"], "images": [b64encode(b"GIF89a....").decode()]}
    error = requests.post(shared.url + "/score", json=not_png, timeout=10).json()["error"]
    assert "images[0] is not a base64-encoded PNG" in error
    assert " object at 0x" not in error and "BytesIO" not in error, error
    huge = "\x1b[31m" + "r" * (8 << 20)  # 8 MB, led by a terminal escape
    answer = requests.post(shared.url + "/score", json={"reward": huge, "prompts": ["a"], "images": ["x"]}, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    # The name is cut to a short prefix; what remains is the list of the served rewards' names.
    from cosmos_rl.rewards.registry import builtin_rewards

    assert len(error) < 160 + sum(len(name) + 4 for name in builtin_rewards()), len(error)
    assert "r" * 200 not in error
    assert "\x1b" not in error and "\\x1b[31m" in error  # escaped, not passed to a terminal
    assert f"({len(huge)} characters)" in error and "unknown reward" in error


def test_a_trailing_slash_is_checked_for_the_token_and_never_redirected():
    with RewardServer(revision=REVISION, token="s3cret") as server:
        for method in ("POST", "GET"):
            for path in ("/score/", "/info/"):
                answer = requests.request(method, server.url + path, timeout=10, allow_redirects=False)
                assert answer.status_code == 401, (method, path, answer.status_code)
        good = {"Authorization": "Bearer s3cret"}
        answer = requests.post(server.url + "/score/", headers=good, timeout=10, allow_redirects=False)
        assert answer.status_code == 404 and "no such endpoint /score/" in answer.json()["error"]


def test_the_uvicorn_service_reads_back_the_connection_limits_it_was_given():
    with RewardServer(revision=REVISION, limits=Limits(header_timeout_s=2.5, body_timeout_s=7.0)) as server:
        limits = server.connection_limits()
    assert limits["header_timeout_s"] == 2.5 and limits["body_timeout_s"] == 7.0 and limits["keep_alive_s"] == 5.0
