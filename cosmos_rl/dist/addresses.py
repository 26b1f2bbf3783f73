"""Loopback addresses and ports: the one place that decides what counts as "this host only"."""

from __future__ import annotations

import ipaddress
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
