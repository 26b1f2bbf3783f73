"""Reward service benchmark: throughput at 1-64 concurrent requests, and the hostile cases.

Starts `cosmos-rl reward serve` in a subprocess (`--pythonpath` picks which checkout's service runs,
so an older tree can be measured with the same client), then:
  - throughput: images scored per second at each concurrency, counting answered vs failed requests;
  - hostile cases, each on a fresh service so the peak memory (VmHWM) is that case's alone:
    a 12000x12000 PNG of zeros (about 445 KB) once and three times in one request; an
    unauthenticated 200 MiB body to a service with a token; 400 slow connections that send half a
    request line; malformed fields; `--port 99999`; one connection trickling its headers a byte
    every 0.5 s, to the plain service and to `--replicas 1` (Ray Serve): when each cuts it.

    python bench/reward_bench.py [--pythonpath /path/to/checkout] [--quick] [--only-trickle]

Prints one JSON object. Every request goes to 127.0.0.1 and every loop is bounded.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
from PIL import Image

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
TOKEN = "bench-token"


# ------------------------------------------------------------------------------------ service
class Service:
    """`cosmos-rl reward serve --port 0` in a subprocess; the URL is read from its first line."""

    def __init__(self, pythonpath: str, *extra: str, token: str | None = None):
        env = {**os.environ, "PYTHONPATH": pythonpath}
        args = [sys.executable, "-m", "cosmos_rl.cli", "reward", "serve", "--revision", "bench", "--port", "0", *extra]
        if token:
            env["BENCH_TOKEN"] = token
            args += ["--token-env", "BENCH_TOKEN"]
        # cwd too: `python -m` puts the working directory ahead of PYTHONPATH.
        self.proc = subprocess.Popen(args, env=env, cwd=pythonpath, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            self.stop()
            raise RuntimeError(f"service did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
        url = line.split("listening on ")[1].split()[0]
        self.host, port = url.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)

    def status_kb(self, field: str) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return -1

    def threads(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _png(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode()


def _post(host: str, port: int, body: bytes, token: str | None = None, timeout: float = 60.0) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", "/score", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# --------------------------------------------------------------------------------- throughput
def throughput(service: Service, images_per_request: int, side: int, rounds: int) -> list[dict]:
    rng = np.random.default_rng(0)
    images = [_png(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(images_per_request)]
    body = json.dumps({"reward": "brightness", "prompts": ["a"] * images_per_request, "images": images}).encode()
    rows = []
    for concurrency in CONCURRENCY:
        ok, failed = [0], [0]
        lock = threading.Lock()
        barrier = threading.Barrier(concurrency)

        def worker():
            barrier.wait()  # every request of a round leaves at the same moment, as NFT ranks do
            for _ in range(rounds):
                try:
                    status = _post(service.host, service.port, body)
                except OSError:
                    status = -1
                with lock:
                    (ok if status == 200 else failed)[0] += 1

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
        rows.append({
            "concurrency": concurrency, "requests": concurrency * rounds, "answered_200": ok[0], "failed": failed[0],
            "images_per_s": round(ok[0] * images_per_request / seconds, 1), "seconds": round(seconds, 2),
        })  # fmt: skip
    return rows


# ----------------------------------------------------------------------------------- hostile
def bomb_png(side: int = 12000) -> str:
    """A valid RGB PNG of zeros, side x side, written row by row (zlib shrinks it about 1000x)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    z = zlib.compressobj(9)
    row = b"\x00" * (1 + side * 3)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def case_bomb(pythonpath: str, bomb: str, count: int) -> dict:
    service = Service(pythonpath)
    try:
        before = service.status_kb("VmHWM")
        body = json.dumps({"reward": "brightness", "prompts": ["a"] * count, "images": [bomb] * count}).encode()
        start = time.perf_counter()
        try:
            status = _post(service.host, service.port, body, timeout=120)
        except OSError as exc:
            status = f"error: {exc!r}"
        seconds = time.perf_counter() - start
        return {
            "images": count, "png_kb": round(len(bomb) * 3 / 4 / 1000), "status": status, "seconds": round(seconds, 2),
            "peak_rss_growth_mb": round((service.status_kb("VmHWM") - before) / 1024), "service_alive": service.alive(),
        }  # fmt: skip
    finally:
        service.stop()


def case_unauthenticated_body(pythonpath: str, mib: int = 200) -> dict:
    service = Service(pythonpath, token=TOKEN)
    try:
        before = service.status_kb("VmHWM")
        sock = socket.create_connection((service.host, service.port), timeout=30)
        head = (f"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {mib << 20}\r\n\r\n").encode()  # fmt: skip
        sock.sendall(head)
        sent, chunk, answered_after = 0, b"x" * (1 << 20), None
        sock.setblocking(False)
        status = None
        start = time.perf_counter()
        while sent < (mib << 20):
            try:
                data = sock.recv(4096)
                if data:
                    status = int(data.split(b" ", 2)[1])
                    answered_after = sent
                    break
            except BlockingIOError:
                pass
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                break  # the server closed the connection
        if status is None:
            sock.setblocking(True)
            sock.settimeout(30)
            try:
                data = sock.recv(4096)
                status = int(data.split(b" ", 2)[1]) if data else "closed"
            except OSError as exc:
                status = f"error: {exc!r}"
            answered_after = sent
        sock.close()
        return {
            "body_mib": mib, "status": status, "answered_after_mib": round((answered_after or 0) / (1 << 20), 1),
            "seconds": round(time.perf_counter() - start, 2),
            "peak_rss_growth_mb": round((service.status_kb("VmHWM") - before) / 1024), "service_alive": service.alive(),
        }  # fmt: skip
    finally:
        service.stop()


def case_slow_connections(pythonpath: str, count: int, hold_s: float) -> dict:
    service = Service(pythonpath)
    socks = []
    try:
        threads_before = service.threads()
        for _ in range(count):
            s = socket.create_connection((service.host, service.port), timeout=5)
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")  # and never the rest
            s.setblocking(False)
            socks.append(s)
        time.sleep(1.0)
        threads_held = service.threads()
        deadline = time.monotonic() + hold_s
        closed = set()
        while time.monotonic() < deadline and len(closed) < count:
            for i, s in enumerate(socks):
                if i in closed:
                    continue
                try:
                    if s.recv(4096) == b"":
                        closed.add(i)
                    else:
                        closed.add(i)  # answered (e.g. 408) and then closed
                except BlockingIOError:
                    pass
                except OSError:
                    closed.add(i)
            time.sleep(0.2)
        body = json.dumps({"reward": "brightness", "prompts": ["a"], "images": [_png(np.zeros((8, 8, 3), np.uint8))]}).encode()
        try:
            normal = _post(service.host, service.port, body, timeout=10)
        except OSError as exc:
            normal = f"error: {exc!r}"
        return {
            "connections": count, "hold_s": hold_s, "closed_by_service": len(closed),
            "threads_before": threads_before, "threads_while_held": threads_held, "normal_request_status": normal,
        }  # fmt: skip
    finally:
        for s in socks:
            s.close()
        service.stop()


def case_header_trickle(pythonpath: str, hold_s: float, *extra: str) -> dict:
    """One connection sending its request headers one byte every 0.5 s: when does the service cut
    it? uvicorn (the plain service) at its header deadline; `--replicas` (Ray Serve's proxy, which
    takes no header deadline) is reported as still open after `hold_s`."""
    service = Service(pythonpath, *extra)
    try:
        headers = b"POST /score HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 100_000
        sock = socket.create_connection((service.host, service.port), timeout=5)
        sock.setblocking(False)
        began, sent, cut_at = time.monotonic(), 0, None
        while time.monotonic() - began < hold_s:
            try:
                if sock.recv(4096) == b"":
                    cut_at = time.monotonic() - began
                    break
            except BlockingIOError:
                pass
            except OSError:
                cut_at = time.monotonic() - began
                break
            try:
                sock.send(headers[sent:sent + 1])
                sent += 1
            except OSError:  # reset by the service
                cut_at = time.monotonic() - began
                break
            time.sleep(0.5)
        sock.close()
        return {"host": "ray_serve" if extra else "uvicorn", "bytes_sent": sent, "hold_s": hold_s,
                "cut_after_s": None if cut_at is None else round(cut_at, 1), "open_at_end": cut_at is None}  # fmt: skip
    finally:
        service.stop()


def case_malformed(pythonpath: str) -> dict:
    service = Service(pythonpath)
    image = _png(np.zeros((8, 8, 3), np.uint8))
    cases = {
        "reward_list": {"reward": [], "prompts": ["a"], "images": [image]},
        "reward_object": {"reward": {}, "prompts": ["a"], "images": [image]},
        "prompts_string": {"reward": "brightness", "prompts": "a", "images": [image]},
        "images_number": {"reward": "brightness", "prompts": ["a"], "images": 3},
        "body_array": [1, 2],
    }
    try:
        return {name: _post(service.host, service.port, json.dumps(body).encode()) for name, body in cases.items()}
    finally:
        service.stop()


def case_bad_port(pythonpath: str) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    proc = subprocess.run(
        [sys.executable, "-m", "cosmos_rl.cli", "reward", "serve", "--revision", "bench", "--port", "99999"],
        env=env, cwd=pythonpath, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return {"exit_code": proc.returncode, "traceback": "Traceback" in proc.stderr, "stderr_tail": proc.stderr.strip()[-200:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pythonpath", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--images-per-request", type=int, default=4)
    parser.add_argument("--side", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=4, help="requests per concurrent client")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and slow connections")
    parser.add_argument("--trickle-s", type=float, default=130.0, help="how long the header trickle is kept up")
    parser.add_argument("--only-trickle", action="store_true", help="only the header trickle, on both hosts")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    out: dict = {"pythonpath": args.pythonpath, "images_per_request": args.images_per_request, "side": args.side}
    trickle = 30.0 if args.quick else args.trickle_s
    if args.only_trickle:
        out["header_trickle"] = [case_header_trickle(args.pythonpath, trickle),
                                 case_header_trickle(args.pythonpath, trickle, "--replicas", "1")]  # fmt: skip
        print(json.dumps(out, indent=2))
        return
    service = Service(args.pythonpath)
    try:
        out["throughput"] = throughput(service, args.images_per_request, args.side, rounds)
    finally:
        service.stop()
    bomb = bomb_png()
    out["bomb_x1"] = case_bomb(args.pythonpath, bomb, 1)
    out["bomb_x3"] = case_bomb(args.pythonpath, bomb, 3)
    out["unauthenticated_200mib"] = case_unauthenticated_body(args.pythonpath)
    out["slow_connections"] = case_slow_connections(args.pythonpath, 100 if args.quick else 400, 8.0 if args.quick else 15.0)
    out["malformed"] = case_malformed(args.pythonpath)
    # Plain uvicorn vs Ray Serve's proxy (docs/rewards.md, "Connection limits"): 10 s vs not cut.
    out["header_trickle"] = [case_header_trickle(args.pythonpath, trickle),
                             case_header_trickle(args.pythonpath, trickle, "--replicas", "1")]  # fmt: skip
    out["port_99999"] = case_bad_port(args.pythonpath)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
