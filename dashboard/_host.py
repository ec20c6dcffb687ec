"""The dashboard answers only a browser that asked for it by an address it serves: a page on
another site can point its own host name at 127.0.0.1 (DNS rebinding) and read the results
through the visitor's browser; the browser then sends that site's name as the Host header.

Allowed: an IP address (a browser sends one only where it was asked for by number), localhost,
this machine's host names, and the names `speedlib dashboard` lists in $SPEEDLIB_ALLOWED_HOSTS
(its --address, and each --allow-host: the name a proxy in front of it serves). Streamlit itself
checks no Host header, so every page checks it before it runs (dashboard/app.py)."""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from collections.abc import Iterable

ALLOWED_ENV = "SPEEDLIB_ALLOWED_HOSTS"  # comma-separated host names, set by `speedlib dashboard`


def host_name(header: str) -> str:
    """The host of a Host header, without its port, lower case, without a final dot."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8501
        return header[1:header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        header = header.rsplit(":", 1)[0]
    return header.rstrip(".")


@functools.cache
def _own_names() -> frozenset[str]:
    names = {"localhost"}
    for ask in (socket.gethostname, socket.getfqdn):
        try:
            names.add(ask().lower().rstrip("."))
        except OSError:
            pass
    return frozenset(names)


def allowed_names() -> frozenset[str]:
    """The host names the dashboard answers to (IP addresses besides)."""
    listed = (n.strip().lower().rstrip(".") for n in os.environ.get(ALLOWED_ENV, "").split(","))
    return _own_names() | {n for n in listed if n}


def host_allowed(header: str | None, names: Iterable[str] | None = None) -> bool:
    """Whether a request with this Host header may be answered. None or empty: no browser sent it
    (Streamlit's own test harness), and nothing to rebind."""
    if not header:
        return True
    host = host_name(header)
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    return host in (allowed_names() if names is None else {n.lower() for n in names})
