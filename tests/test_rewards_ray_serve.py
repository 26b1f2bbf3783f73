"""The same reward app on Ray Serve: two CPU replicas on the session's local cluster, reached by URL."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from _reward_models import tiny_clip_folder
from cosmos_rl.core.media import MediaSpec
from cosmos_rl.dist.addresses import free_loopback_port
from cosmos_rl.rewards.client import RewardClient
from cosmos_rl.rewards.functions import brightness
from cosmos_rl.rewards.models import ClipRewardModel
from cosmos_rl.rewards.multi import MultiRewardClient, RewardTerm, client_for
from cosmos_rl.rewards.serve_ray import APP_NAME, RayServeService

pytestmark = pytest.mark.slow

IMAGE_RUN = MediaSpec.image(32)  # what a run makes; check_revision asks only images or clips
REVISION = "ray-serve-1"


def test_two_replicas_serve_a_model_reward_and_a_weight_free_one(ray_cluster, tmp_path):
    from ray import serve

    folder = tiny_clip_folder(tmp_path / "clip")
    local = ClipRewardModel("pickscore", folder)
    service = RayServeService(
        "127.0.0.1", free_loopback_port(), REVISION, token="t0k", models={"pickscore": str(folder)},
        replicas=2, cpus_per_replica=0.5,
    )  # fmt: skip
    url = service.start()
    try:
        replicas = serve.status().applications[APP_NAME].deployments["reward"].replica_states
        assert replicas == {"RUNNING": 2}
        terms = [
            RewardTerm("rl.rewards[0]", "pickscore", 1.0, url, REVISION, local.revision, "", 30.0, 1, 0.1, "RS_TOKEN"),
            RewardTerm("rl.rewards[1]", "brightness", 0.5, url, REVISION, "", "", 30.0, 1, 0.1, "RS_TOKEN"),
        ]
        client = MultiRewardClient(terms, [client_for(t, url, "t0k") for t in terms])
        info = client.check_revisions(IMAGE_RUN)
        assert info["pickscore"]["revisions"]["pickscore"] == local.revision  # the weights' hash, from a replica
        images = np.random.default_rng(0).integers(0, 256, (2, 24, 24, 3), dtype=np.uint8)
        prompts = ["a red cube", "blue"]
        results, errors = [], []

        def score():
            try:
                results.append(client.score(images, prompts))
            except Exception as exc:  # collected: the assertion names them
                errors.append(repr(exc))

        threads = [threading.Thread(target=score) for _ in range(8)]  # enough for both replicas to answer
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        for got in results:
            assert got["pickscore"] == pytest.approx(local(images, prompts), rel=1e-5)
            assert got["brightness"] == brightness(images, prompts)
        with pytest.raises(Exception, match="bearer token"):
            RewardClient(url, "brightness", REVISION, 10, 0, 0.0).check_revision(IMAGE_RUN)
        client.close()
        _assert_the_documented_connection_limits(service)
    finally:
        service.stop()


def _assert_the_documented_connection_limits(ray_service: RayServeService) -> None:
    """Both hosts read their connection limits back from the running server; docs/rewards.md's
    table says the same: one keep-alive and one pair of app deadlines, and a header deadline only
    under uvicorn (Ray Serve's proxy takes none), where Ray Serve bounds a request end to end."""
    from cosmos_rl.rewards.server import RewardServer

    with RewardServer(revision=REVISION) as uvicorn_service:
        plain = uvicorn_service.connection_limits()
    served = ray_service.connection_limits()
    assert plain == {"header_timeout_s": 10.0, "keep_alive_s": 5.0, "request_timeout_s": None,
                     "body_timeout_s": 30.0, "score_timeout_s": 300.0}  # fmt: skip
    assert served == {**plain, "header_timeout_s": None, "request_timeout_s": 330.0}
