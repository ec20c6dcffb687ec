"""`speedlib dashboard`: Streamlit on the results, stopped with this process."""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import time
import webbrowser
from collections.abc import Sequence
from pathlib import Path

from speedbench import CHECKOUT
from speedbench.cli import report
from speedbench.results.common import printable
from speedbench.run import supervise

DASHBOARD_EXIT_STATUS = """exit status:
  0  stopped by Ctrl+C or SIGTERM (Streamlit stopped with it)
  2  refused, one line on stderr says why: a bad --port or --address, no results directory,
     Streamlit not installed, the port taken, Streamlit not serving within the start-up time
  other  Streamlit's own status, where it exited by itself"""


def _cmd_dashboard(args: argparse.Namespace, argv: Sequence[str]) -> int:
    bad = _bad_port(args.port) or _bad_address(args.address) or next(filter(None, map(_bad_host, args.allow_host)),
                                                                       None)
    if bad:
        print(f"speedlib dashboard: {bad}", file=sys.stderr)
        return 2
    port = int(args.port)
    app = CHECKOUT / "dashboard" / "app.py"
    if not app.is_file():
        print(f"speedlib dashboard: no dashboard at {printable(app)}: run it from a checkout "
              "(python3 -m pip install -e \".[dashboard]\")", file=sys.stderr)
        return 2
    if importlib.util.find_spec("streamlit") is None:
        print('speedlib dashboard: Streamlit is not installed: python3 -m pip install -e ".[dashboard]"',
              file=sys.stderr)
        return 2
    results = Path(args.results).resolve()
    if not results.is_dir():
        print(f"speedlib dashboard: no results directory at {printable(results)}", file=sys.stderr)
        return 2
    unavailable = _cannot_listen(args.address, port)
    if unavailable:
        print(f"speedlib dashboard: cannot listen on {args.address}:{port} ({unavailable}); is a dashboard "
              "already running there? Pass another --port.", file=sys.stderr)
        return 2
    # The results directory is fixed here, at start-up, and never read from the URL. The host
    # names it answers to besides IP addresses, localhost and this machine's names: the app
    # refuses a page asked for by any other (DNS rebinding: dashboard/_host.py).
    allowed = ",".join(dict.fromkeys([args.address, *args.allow_host]))
    env = {**os.environ, "SPEEDLIB_RESULTS": str(results), "SPEEDLIB_ALLOWED_HOSTS": allowed}
    # Always headless: a Streamlit that is not headless asks for an e-mail address on its
    # first run and, with no terminal to answer (CI, ssh -T, a batch job), exits 255 with
    # nothing served. The browser is opened from here instead, once the port is bound.
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", args.address,
           "--server.port", str(port), "--browser.gatherUsageStats", "false",
           "--server.headless", "true",
           # a results viewer, not an app being developed: no "Deploy" button, no developer menu
           "--client.toolbarMode", "viewer",
           # nor one whose source is watched: after every page view Streamlit resolved the path of
           # each of the thousands of modules loaded (a second on 2 cores, holding the GIL the pages need)
           "--server.fileWatcherType", "none", "--server.runOnSave", "false"]
    url = _url(args.address, port)
    # The Overview's tables computed ahead while Streamlit starts, in a process of its own (the
    # other core), so the first view reads them back (speedbench.report.first_view); it ends
    # with this process too, and where it fails the page computes them itself.
    warm = subprocess.Popen([sys.executable, "-m", "speedbench.report.first_view", str(results)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_dies_with(os.getpid()))
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_dies_with(os.getpid()))
    # A SIGTERM to speedlib (kill, a service manager) must stop Streamlit too, not orphan it.

    def _stop(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        if not _wait_until_listening(proc, args.address, port, timeout=STARTUP_TIMEOUT_S):
            if proc.poll() is None:
                proc.terminate()
                print(f"speedlib dashboard: Streamlit did not listen on {url} within {STARTUP_TIMEOUT_S:.0f} s; "
                      "stopped it", file=sys.stderr)
            else:
                print(f"speedlib dashboard: Streamlit exited with status {proc.returncode} before serving "
                      f"{url} (its messages are above)", file=sys.stderr)
            proc.wait()
            return 2
        print(f"speedlib dashboard: serving {printable(results)} on {url} (Ctrl+C stops it)", flush=True)
        if not args.no_browser:
            _open_browser(url)
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return 0
    finally:
        if warm.poll() is None:
            warm.terminate()
        warm.wait()
        signal.signal(signal.SIGTERM, previous)


def _url(address: str, port: int) -> str:
    """The dashboard's address as a browser takes it: an IPv6 address in brackets."""
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


STARTUP_TIMEOUT_S = 120.0  # Streamlit imports pandas and plotly: seconds on a cold, busy machine


def _bad_port(text: str) -> str | None:
    """Why `text` is no port to serve on, or None. Not 0: the system would pick one, and the
    URL printed could not name it."""
    try:
        if 1 <= int(text) <= 65535:
            return None
    except ValueError:
        pass
    return f"--port must be a whole number from 1 to 65535, got '{printable(text)}'"


def _bad_address(address: str) -> str | None:
    """Why `address` is no address to serve on, or None: an IP address, or a host name this
    machine resolves (asked of the resolver, as Streamlit will)."""
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    try:
        socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        return None
    except (OSError, UnicodeError):  # UnicodeError: not even a host name (an empty label: "a..b")
        return (f"--address '{printable(address)}' is neither an IP address nor a host name this machine resolves: "
                "pass one such as 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)")


def _bad_host(name: str) -> str | None:
    """Why `name` is no host name for --allow-host, or None: letters, digits, dots and dashes."""
    if re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", name) and ".." not in name:
        return None
    return f"--allow-host '{printable(name)}' is not a host name: letters, digits, dots and dashes, as a URL names it"


def _dies_with(parent: int):
    """A preexec_fn for Streamlit: the kernel stops it (SIGTERM, which Streamlit handles by
    shutting down) when speedlib dies, even by SIGKILL, where speedlib cannot stop it
    itself and it would go on serving the port. Linux only (prctl); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:
        supervise.die_with_parent(signal.SIGTERM)
        if os.getppid() != parent:  # speedlib died before the signal was armed
            os._exit(1)

    return arm


def _wait_until_listening(proc, address: str, port: int, timeout: float) -> bool:
    """True once something accepts connections on address:port while `proc` runs; False when
    `proc` exits first or `timeout` seconds pass. The URL is printed only after this, so a
    script that reads it can connect at once."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _open_browser(url: str) -> None:
    """Open `url` where a browser can show it: on macOS and Windows, or under a Linux/BSD
    display server. Elsewhere (ssh, containers, CI) the printed URL is the way in."""
    if sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        try:
            webbrowser.open(url)
        except webbrowser.Error:
            pass  # the URL is printed already


def _cannot_listen(address: str, port: int) -> str | None:
    """Why a server could not listen on address:port, or None. Asked before Streamlit starts:
    it would print its banner first and then fail, or quietly take another port. SO_REUSEADDR
    as a server sets it: a port left in TIME_WAIT is free, one with a listener is not."""
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
    except OSError as e:  # socket.gaierror too: an address that does not resolve
        return e.strerror or str(e)
    return None


def add_parser(sub) -> None:
    dash = sub.add_parser("dashboard", help="open the Streamlit dashboard on the results",
                          description="Serve the Streamlit dashboard on a results directory (fixed at start-up, "
                                      "never taken from the URL) until Ctrl+C.",
                          epilog=DASHBOARD_EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    dash.add_argument("--results", default=report.RESULTS,
                      help="results directory (default: this checkout's results/, as `speedlib report`)")
    dash.add_argument("--address", default="127.0.0.1",
                      help="address to listen on (default: 127.0.0.1, this machine only)")
    dash.add_argument("--port", default="8501", help="port (default: 8501)")
    dash.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                      help="a host name to answer to besides --address, IP addresses, localhost and this machine's "
                           "names: the name a proxy in front of the dashboard serves (repeatable); a page asked for "
                           "by any other name is refused, so another site cannot read it through your browser")
    dash.add_argument("--no-browser", action="store_true",
                      help="do not open a browser window (none is opened without a display anyway)")
    dash.set_defaults(func=_cmd_dashboard)
