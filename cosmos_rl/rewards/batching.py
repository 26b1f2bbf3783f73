"""Dynamic batching: concurrent /score requests for one reward are scored in one call.

Every NFT rank posts at the same moment, so a model reward sees G small requests at once; one
forward pass over all of them costs about what one request does. Each reward has one worker
thread (a model is never run concurrently with itself); while it scores a batch, the requests
that arrive queue up and form the next one. Requests whose images differ in size are scored in
separate calls. A reward that raises for a batch is retried request by request, so one bad
request (e.g. a prompt naming no colour) fails alone.
"""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

import attrs
import numpy as np

from cosmos_rl.rewards import dimensions
from cosmos_rl.rewards.registry import Reward


@attrs.define
class _Item:
    images: np.ndarray
    prompts: list[str]
    future: asyncio.Future
    actions: np.ndarray | None = None  # [N, rows, width]: an action reward's rows (Reward.takes_actions)


class RewardError(Exception):
    """The reward function failed for a request; `bad_input` means its input was at fault (400)."""

    def __init__(self, message: str, bad_input: bool):
        super().__init__(message)
        self.bad_input = bad_input


def _checked(result, count: int, reward: Reward | None = None) -> list[float] | dimensions.Scored:
    """The reward's answer checked: a list of `count` finite floats, or (a reward with dimensions) a
    `dimensions.Scored` whose scores and every declared dimension hold `count` finite floats."""
    scores, dims = dimensions.split(result)
    scores = [float(s) for s in scores]
    if len(scores) != count:
        raise RewardError(f"the reward returned {len(scores)} scores for {count} images", bad_input=False)
    if not all(math.isfinite(s) for s in scores):
        raise RewardError(f"the reward returned non-finite scores {scores}", bad_input=False)
    declared = reward.dimensions if reward is not None else ()
    if not declared and not dims:
        return scores
    why = dimensions.problem(dims, declared, count)
    if why:
        raise RewardError(f"the reward returned {why}", bad_input=False)
    return dimensions.Scored(scores, {k: [float(v) for v in dims[k]] for k in declared})


def _part(result, start: int, stop: int):
    """Samples start:stop of a checked answer (its dimensions too)."""
    if isinstance(result, dimensions.Scored):
        return dimensions.Scored(result.scores[start:stop], {k: v[start:stop] for k, v in result.dimensions.items()})
    return result[start:stop]


def _score_one(reward: Reward, item: _Item) -> list[float] | dimensions.Scored | RewardError:
    try:
        return _checked(_call(reward, item.images, item.prompts, item.actions), len(item.prompts), reward)
    except RewardError as exc:
        return exc
    except ValueError as exc:  # the reward's own input checks (shapes, prompts it cannot score)
        return RewardError(str(exc), bad_input=True)
    except Exception as exc:  # a reward bug: this request fails, the service keeps serving
        return RewardError(f"reward {reward.name} failed: {exc!r}", bad_input=False)


def _call(reward: Reward, images: np.ndarray, prompts: list[str], actions: np.ndarray | None):
    """The reward's fn on a batch; an action reward's with the batch's rows."""
    return reward.fn(images, prompts, actions=actions) if reward.takes_actions else reward.fn(images, prompts)


def _score_group(reward: Reward, items: list[_Item]) -> list[list[float] | RewardError]:
    if len(items) == 1:
        return [_score_one(reward, items[0])]
    images = np.concatenate([item.images for item in items])
    prompts = [p for item in items for p in item.prompts]
    actions = np.concatenate([item.actions for item in items]) if reward.takes_actions else None
    try:
        scores = _checked(_call(reward, images, prompts, actions), len(prompts), reward)
    except Exception:  # find the request at fault by scoring each alone
        return [_score_one(reward, item) for item in items]
    out, start = [], 0
    for item in items:
        out.append(_part(scores, start, start + len(item.prompts)))
        start += len(item.prompts)
    return out


class Batcher:
    """Queues requests for one reward and scores them in batches of up to `reward.max_batch` images."""

    def __init__(self, reward: Reward, wait_s: float = 0.005):
        self.reward = reward
        self.wait_s = wait_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"reward-{reward.name}")
        self._queue: list[_Item] = []
        self._task: asyncio.Task | None = None
        self.batches = 0  # calls made, for tests and the bench

    async def score(self, images: np.ndarray, prompts: list[str], actions: np.ndarray | None = None) -> list[float] | dimensions.Scored:
        loop = asyncio.get_running_loop()
        item = _Item(images, prompts, loop.create_future(), actions)
        self._queue.append(item)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        result = await item.future
        if isinstance(result, RewardError):
            raise result
        return result

    def _take(self) -> list[_Item]:
        taken, images = [], 0
        while self._queue and (not taken or images + len(self._queue[0].prompts) <= self.reward.max_batch):
            item = self._queue.pop(0)
            if item.future.done():  # its request timed out or went away
                continue
            taken.append(item)
            images += len(item.prompts)
        return taken

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            if self.wait_s and sum(len(i.prompts) for i in self._queue) < self.reward.max_batch:
                await asyncio.sleep(self.wait_s)  # let the rest of a burst arrive
            batch = self._take()
            groups: dict[tuple, list[_Item]] = {}
            for item in batch:
                rows = None if item.actions is None else item.actions.shape[1:]  # an action reward's batches share a row shape too
                groups.setdefault((item.images.shape[1:], rows), []).append(item)
            for items in groups.values():
                self.batches += 1
                try:
                    results = await loop.run_in_executor(self._executor, _score_group, self.reward, items)
                except RuntimeError as exc:  # the executor is shut down: the service is stopping
                    results = [RewardError(f"the service is stopping ({exc})", bad_input=False)] * len(items)
                for item, result in zip(items, results):
                    if not item.future.done():
                        item.future.set_result(result)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
