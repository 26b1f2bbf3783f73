"""Loopback addresses and ports: the one place that decides what counts as "this host only"."""

from __future__ import annotations

import ipaddress
import re
import socket


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`; False for any other name or address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$")


def ray_address_problem(address: str) -> str | None:
    """Why `address` is no Ray cluster address ray.init could join, or None when it is one:
    `auto`, `host:port` (a GCS) or `ray://host[:port]` (Ray Client), the host a name or an IP
    (an IPv6 one in brackets), the port 1 to 65535. Judged before Ray starts or connects."""
    if address in ("auto", "local"):
        return None
    client = address.startswith("ray://")
    rest = address[len("ray://"):] if client else address
    host, colon, port = rest.rpartition(":") if rest.count(":") == 1 or rest.startswith("[") else ("", "", "")
    if not colon:
        if client and rest and ":" not in rest:
            host, port = rest, ""
        else:
            return "is not host:port, ray://host:port or auto"
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        return f"has port {port!r}, not a number in 1..65535"
    if not client and not port:
        return "has no port (host:port, the cluster's GCS port, usually 6379)"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not _HOSTNAME.match(host):
            return f"has host {host!r}, neither a host name nor an IP address"
    return None
