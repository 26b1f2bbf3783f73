"""A stand-in OpenAI-compatible chat server for the VLM judge's tests, on 127.0.0.1 (stdlib
http.server): what a vLLM or SGLang server behind the judge answers, reduced to what the judge
reads. Shared by tests/test_vlm_judge.py and the video model rewards' end-to-end run."""

from __future__ import annotations

import base64
import io
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"


def _decoded(part: dict) -> np.ndarray:
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))


class StandIn:
    """A chat server answering each caption (read from the request's text) with `answers[caption]`;
    a caption in `slow` waits 2 s first. Keeps every request body."""

    def __init__(self):
        self.answers: dict[str, str] = {}
        self.slow: set[str] = set()
        self.requests: list[dict] = []
        self.by_brightness = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, body: dict, code: int = 200):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                assert self.path == "/v1/models"
                self._send({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

            def do_POST(self):
                assert self.path == "/v1/chat/completions"
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                text = body["messages"][0]["content"][-1]["text"]
                caption = re.search(r'caption "([^"]*)"', text).group(1)
                if caption in owner.slow:
                    time.sleep(2.0)
                if owner.by_brightness:  # a judge that likes bright images: 10 x the first image's mean level
                    answer = f"Score: {10 * _decoded(body['messages'][0]['content'][0]).mean() / 255:.3f}"
                else:
                    answer = owner.answers[caption]
                self._send({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
