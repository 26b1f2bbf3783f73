"""Pull an ``s3://bucket/prefix`` base into a local cache once per node, then reuse it.

Every rank of a run asks for the base at start-up. The first to take the cache's file lock
downloads everything under the prefix into a ``.partial-`` folder and renames it to the final
folder (``layout.s3_cache_dir``) only when complete; the others wait on the lock and then find the
finished copy, so the bucket serves each object once per node (once per cluster when the cache
sits on a shared file system whose locks span nodes). Later runs and requeues reuse the copy
without any S3 request. A crash mid-pull leaves no usable half copy: the lock is released with
the process, and the next taker deletes the stale ``.partial-`` folders and pulls again.

Errors name the URL the user wrote; the endpoint comes from ``endpoint_url``, else
``AWS_ENDPOINT_URL`` (boto3's own lookup). Torch-free: nothing here imports a model library.
"""

from __future__ import annotations

import fcntl
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

from cosmos_rl.core.errors import UserError
from cosmos_rl.models.layout import s3_cache_dir, split_s3

INIT_FROM = "rl.init_from"


def lock_path(target: Path) -> Path:
    return target.parent / f".lock-{target.name}"


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    # flock is released by the kernel when the holder dies, so a killed puller never wedges the rest.
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(url: str, partial: Path, endpoint_url: str | None) -> int:
    import boto3

    bucket, prefix = split_s3(url)
    client = boto3.client("s3", endpoint_url=endpoint_url)
    pulled = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            if not rel or rel.endswith("/"):
                continue  # "directory" placeholder objects
            parts = PurePosixPath(rel).parts
            if rel.startswith("/") or ".." in parts:
                raise UserError(f"{INIT_FROM}: object key {obj['Key']!r} in {url} escapes the prefix")
            dest = partial.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, obj["Key"], str(dest))
            pulled += 1
    return pulled


def pull_once(url: str, cache_root: str | Path, endpoint_url: str | None = None) -> Path:
    """The local copy of everything under `url`, pulled now unless this node already has it."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        target = s3_cache_dir(url, cache_root)
    except ValueError as exc:
        raise UserError(f"{INIT_FROM}: {exc}") from None
    if target.is_dir():  # only ever created by the rename below, so it is complete
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(lock_path(target)):
        if target.is_dir():  # another process pulled it while this one waited
            return target
        for stale in target.parent.glob(f".partial-{target.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed puller (we hold the lock)
        partial = target.parent / f".partial-{target.name}-{secrets.token_hex(4)}"
        try:
            if _download(url, partial, endpoint_url) == 0:
                raise UserError(f"{INIT_FROM}: no objects under {url}; check the bucket and prefix")
        except (BotoCoreError, ClientError) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise UserError(
                f"{INIT_FROM}: cannot pull {url}: {exc}; check the URL, the AWS credentials and "
                "AWS_ENDPOINT_URL"
            ) from None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        partial.rename(target)
    return target
