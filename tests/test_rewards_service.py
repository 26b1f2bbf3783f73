"""The real reward HTTP server and client, talking over loopback."""

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from cosmos_rl.core.media import MediaSpec
from cosmos_rl.core.errors import UserError
from cosmos_rl.rewards.client import RewardClient, RewardServiceError
from cosmos_rl.rewards.functions import jpeg_compressibility, prompt_colour
from cosmos_rl.rewards.server import RewardServer, serve_forever_cli

from _reward_faults import FaultyRewardServer

IMAGE_RUN = MediaSpec.image(32)  # what a run makes; check_revision asks only images or clips
REVISION = "builtin-rev-1"


@pytest.fixture
def server():
    with FaultyRewardServer(revision=REVISION) as srv:
        yield srv


def _client(url, reward="jpeg_compressibility", revision=REVISION, **kw):
    options = dict(timeout_s=5.0, max_retries=2, backoff_s=0.01)
    options.update(kw)
    return RewardClient(url, reward, revision, **options)


def _images():
    flat = np.full((16, 16, 3), 200, dtype=np.uint8)
    noise = np.random.default_rng(1).integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    return np.stack([flat, noise])


def test_binds_loopback_on_a_free_port(server):
    assert server.url.startswith("http://127.0.0.1:")
    assert server.port > 0


def test_info_and_scoring_match_the_reward_functions(server):
    images = _images()
    client = _client(server.url)
    info = client.check_revision(IMAGE_RUN)
    assert info["revision"] == REVISION
    assert "jpeg_compressibility" in info["rewards"]
    scores = client.score(images, ["a", "b"])
    # PNG is lossless, so the service scores exactly the pixels sent.
    assert scores == jpeg_compressibility(images, ["a", "b"])
    assert scores[0] > scores[1]  # flat compresses better than noise


def test_prompts_travel_with_their_images(server):
    red = np.zeros((4, 4, 3), np.uint8)
    red[..., 0] = 255
    images = np.stack([red, red])
    got = _client(server.url, reward="prompt_colour").score(images, ["red", "blue"])
    assert got == prompt_colour(images, ["red", "blue"])
    assert got[0] == 1.0 and got[1] < 1.0


def test_missing_revision_is_refused():
    with RewardServer(revision=None) as srv:
        with pytest.raises(UserError, match="declares no revision") as err:
            _client(srv.url).check_revision(IMAGE_RUN)
    assert "rl.reward.revision" in str(err.value)
    assert REVISION in str(err.value)


def test_wrong_revision_is_refused_naming_both(server):
    with pytest.raises(UserError) as err:
        _client(server.url, revision="builtin-rev-0").check_revision(IMAGE_RUN)
    message = str(err.value)
    assert "rl.reward.revision" in message
    assert "'builtin-rev-0'" in message and f"'{REVISION}'" in message


def test_empty_pin_is_refused(server):
    with pytest.raises(UserError, match="rl.reward.revision is empty"):
        _client(server.url, revision="").check_revision(IMAGE_RUN)


def test_unknown_reward_is_refused_at_check(server):
    with pytest.raises(UserError, match="rl.reward.name"):
        _client(server.url, reward="aesthetics").check_revision(IMAGE_RUN)


def test_unknown_reward_at_score_is_not_retried(server):
    with pytest.raises(RewardServiceError, match="HTTP 400.*unknown reward"):
        _client(server.url, reward="aesthetics").score(_images(), ["a", "b"])
    assert server.score_requests == 1


def test_bearer_token():
    with RewardServer(revision=REVISION, token="s3cret") as srv:
        with pytest.raises(urllib.error.HTTPError) as raw:
            urllib.request.urlopen(srv.url + "/info", timeout=5)
        assert raw.value.code == 401
        with pytest.raises(UserError, match="token"):
            _client(srv.url).check_revision(IMAGE_RUN)
        with pytest.raises(UserError, match="token"):
            _client(srv.url, token="wrong").score(_images(), ["a", "b"])
        assert srv.score_requests == 0  # refused before scoring
        client = _client(srv.url, token="s3cret")
        client.check_revision(IMAGE_RUN)
        assert len(client.score(_images(), ["a", "b"])) == 2


def test_retries_succeed_after_transient_500s(server):
    server.inject_faults("http_500", "http_500")
    scores = _client(server.url, max_retries=2).score(_images(), ["a", "b"])
    assert len(scores) == 2
    assert server.score_requests == 3


@pytest.mark.parametrize("fault", ["garbage", "wrong_count", "drop_connection"])
def test_each_transient_fault_is_retried(server, fault):
    server.inject_faults(fault)
    scores = _client(server.url, max_retries=1).score(_images(), ["a", "b"])
    assert scores == jpeg_compressibility(_images(), ["a", "b"])
    assert server.score_requests == 2


def test_gives_up_after_max_retries_with_one_line_error(server):
    server.inject_faults("http_500", "http_500", "http_500", "http_500")
    with pytest.raises(RewardServiceError) as err:
        _client(server.url, max_retries=2).score(_images(), ["a", "b"])
    message = str(err.value)
    assert "\n" not in message
    assert "failed 3 time(s)" in message and "HTTP 500" in message
    assert server.score_requests == 3  # 1 try + 2 retries, no more


def test_backoff_doubles(server):
    """backoff 0.1 s, two failures: sleeps 0.1 + 0.2 = 0.3 s before the third try."""
    server.inject_faults("http_500", "http_500")
    start = time.monotonic()
    _client(server.url, max_retries=2, backoff_s=0.1).score(_images(), ["a", "b"])
    assert time.monotonic() - start >= 0.3


def test_timeout(server):
    server.inject_faults("delay:1.0")
    with pytest.raises(RewardServiceError, match="timed out"):
        _client(server.url, timeout_s=0.2, max_retries=0).score(_images(), ["a", "b"])
    server.inject_faults("delay:1.0")
    scores = _client(server.url, timeout_s=0.2, max_retries=1).score(_images(), ["a", "b"])
    assert len(scores) == 2


def test_revision_change_mid_run_stops(server):
    server.inject_faults("wrong_revision")
    with pytest.raises(RewardServiceError, match="changed under the running job"):
        _client(server.url).score(_images(), ["a", "b"])


def test_service_down_raises_after_retries():
    srv = RewardServer(revision=REVISION)
    url = srv.start()
    srv.stop()
    with pytest.raises(RewardServiceError, match="connection failed"):
        _client(url, max_retries=1).check_revision(IMAGE_RUN)


def test_server_rejects_malformed_requests(server):
    def post(payload):
        request = urllib.request.Request(server.url + "/score", data=json.dumps(payload).encode(),
                                         method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=5)
        return err.value.code, json.loads(err.value.read())["error"]

    assert post({"reward": "brightness", "prompts": ["a"], "images": []})[0] == 400
    code, error = post({"reward": "brightness", "prompts": ["a"], "images": ["!!notbase64"]})
    assert code == 400 and "images[0]" in error
    code, error = post({"reward": "brightness", "prompts": ["a"]})
    assert code == 400 and "images" in error


def test_unknown_fault_is_rejected(server):
    with pytest.raises(ValueError, match="unknown fault"):
        server.inject_faults("explode")


def test_cli_requires_a_revision():
    with pytest.raises(UserError, match="--revision"):
        serve_forever_cli("127.0.0.1", 0, "")


def test_cli_serves_until_sigterm():
    code = "from cosmos_rl.rewards.server import serve_forever_cli; " \
           "serve_forever_cli('127.0.0.1', 0, 'cli-rev', None)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split("listening on ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        assert _client(url, revision="cli-rev").check_revision(IMAGE_RUN)["revision"] == "cli-rev"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
