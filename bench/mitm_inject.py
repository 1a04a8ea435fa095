"""mitmdump addon for the proxy bench: the same injection the Benchwright proxy does.

Every request gets the bench's credential header (replacing any the client sent), and the upstream
connection goes to the bench's loopback upstream while TLS still uses SNI and verification for the
reverse-mode host name (there is no DNS for it in the bench). Configured by the bench's env.
"""

import os

from mitmproxy import http
from mitmproxy.proxy import server_hooks

UPSTREAM = (os.environ["BENCH_UPSTREAM_ADDRESS"], int(os.environ["BENCH_UPSTREAM_PORT"]))
HEADER = os.environ["BENCH_HEADER"]
SECRET = os.environ["BENCH_SECRET"]


def server_connect(data: server_hooks.ServerConnectionHookData) -> None:
    # Dial the loopback upstream; SNI and certificate checks keep the reverse-mode name.
    data.server.address = UPSTREAM


def request(flow: http.HTTPFlow) -> None:
    flow.request.headers[HEADER] = SECRET
