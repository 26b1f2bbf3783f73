"""A real moto S3 server on loopback that records every request it serves, for counting downloads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from urllib.parse import unquote

from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "NO_PROXY": "127.0.0.1",
}


class CountingS3Server:
    """moto's S3 app behind a recorder; `object_gets()` counts GETs of object keys (not listings).

    `get_delay_s` makes every object GET that much slower, so concurrent pullers really overlap.
    """

    def __init__(self, get_delay_s: float = 0.0):
        self.get_delay_s = get_delay_s
        self.requests: list[tuple[str, str, str]] = []  # (method, path, query)
        app = DomainDispatcherApplication(create_backend_app)

        def recorder(environ, start_response):
            method, path = environ["REQUEST_METHOD"], unquote(environ.get("PATH_INFO", ""))
            self.requests.append((method, path, environ.get("QUERY_STRING", "")))
            if self.get_delay_s and self._is_object_get(method, path):
                time.sleep(self.get_delay_s)
            return app(environ, start_response)

        self._server = make_server("127.0.0.1", 0, recorder, threaded=True)
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._running = False

    @staticmethod
    def _is_object_get(method: str, path: str) -> bool:
        return method == "GET" and len(path.strip("/").split("/", 1)) == 2  # /bucket/key, not /bucket?list

    def start(self) -> "CountingS3Server":
        """Serve, with moto's in-process state emptied (its buckets outlive one server otherwise)."""
        import urllib.request

        self._thread.start()
        self._running = True
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=30).close()
        self.requests.clear()
        return self

    def stop(self) -> None:
        if self._running:
            self._server.shutdown()
            self._thread.join()
            self._running = False

    def object_gets(self) -> Counter:
        """How many times each object key (`bucket/key`) was downloaded."""
        return Counter(path.strip("/") for method, path, _ in self.requests if self._is_object_get(method, path))
