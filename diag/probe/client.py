"""HTTP to a live inference server: GET and POST-JSON with a timeout and retries (stdlib only).

Retry rule: a request is sent again, after 0.5 s, 1 s, 2 s, ... (doubling, at most `retries`
times), when the connection fails (refused, reset, closed without an answer) or the server
answers 5xx (502/503 while it starts, 500 under load). A 4xx answer is the request's fault
and is never retried. A timeout is not retried: the server may still be working on the
request, and a second copy would count twice in its /metrics. Every failure that is left is
a DiagError naming the URL, what was sent, and the last error.

Worked example: retries 3, the server refuses twice then answers 200 -> two waits (0.5 s,
1 s), the third try's body is returned; refuses four times -> DiagError "cannot reach
http://127.0.0.1:8000/generate ... [Errno 111] Connection refused (4 tries)".

This module knows HTTP; nothing about engines, prompts or files.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit

from diag.errors import DiagError


@dataclass(frozen=True)
class Reply:
    url: str
    status: int
    text: str

    def json(self):
        """The body as JSON; a DiagError naming the URL when it is not."""
        try:
            return json.loads(self.text)
        except json.JSONDecodeError as err:
            raise DiagError("the server's answer is not JSON", file=self.url, expected="a JSON body",
                            found=f"{err}; body starts {self.text[:120]!r}") from None


def base_url(url: str) -> str:
    """'localhost:8000/' -> 'http://localhost:8000'; anything but http(s)://host[:port] is an error."""
    given = url if "://" in url else f"http://{url}"
    parts = urlsplit(given)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DiagError("not a server URL", field="--server", expected="http://HOST:PORT, e.g. "
                        "http://127.0.0.1:30000", found=url)
    try:
        parts.port
    except ValueError:
        raise DiagError("the server URL has a bad port", field="--server", expected="http://HOST:PORT with "
                        "a port in 1..65535", found=url) from None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


class Client:
    """One server: `get(path)` and `post(path, body)` with the module's timeout and retry rules."""

    def __init__(self, url: str, *, timeout: float = 300.0, retries: int = 3, backoff: float = 0.5):
        if not timeout > 0:
            raise DiagError("the request timeout must be positive", field="--timeout", expected="> 0 seconds",
                            found=timeout)
        if retries < 0:
            raise DiagError("retries cannot be negative", field="--retries", expected=">= 0", found=retries)
        self.base, self.timeout, self.retries, self.backoff = base_url(url), timeout, retries, backoff

    def get(self, path: str, *, ok_missing: bool = False) -> Reply | None:
        """GET base+path. With ok_missing, a 404 returns None (an endpoint this release lacks)."""
        return self._send(urllib.request.Request(self.base + path, method="GET"), ok_missing=ok_missing)

    def post(self, path: str, body: dict) -> Reply:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        return self._send(req, ok_missing=False)

    def _send(self, req: urllib.request.Request, *, ok_missing: bool) -> Reply | None:
        last, tries = "", 0
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            tries += 1
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return Reply(req.full_url, resp.status, resp.read().decode("utf-8", "replace"))
            except urllib.error.HTTPError as err:
                text = err.read().decode("utf-8", "replace")
                if err.code == 404 and ok_missing:
                    return None
                if err.code < 500:
                    raise DiagError(f"the server refused {req.get_method()} {req.full_url}", file=req.full_url,
                                    expected="HTTP 200", found=f"HTTP {err.code}: {text[:300]}") from None
                last = f"HTTP {err.code}: {text[:300]}"
            except (TimeoutError, socket.timeout):
                raise DiagError(f"the server did not answer {req.get_method()} {req.full_url} in time",
                                file=req.full_url, field="--timeout", expected=f"an answer within {self.timeout:g} s",
                                found="timed out", hint="raise --timeout, or lower --concurrency") from None
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as err:
                reason = getattr(err, "reason", err)
                if isinstance(reason, (TimeoutError, socket.timeout)):
                    raise DiagError(f"the server did not answer {req.get_method()} {req.full_url} in time",
                                    file=req.full_url, field="--timeout",
                                    expected=f"an answer within {self.timeout:g} s", found="timed out",
                                    hint="raise --timeout, or lower --concurrency") from None
                last = f"{type(reason).__name__}: {reason}"
        raise DiagError(f"cannot reach {req.full_url}", file=req.full_url, field="--server",
                        expected="a running inference server", found=f"{last} ({tries} tries)",
                        hint="check the host and port, and that the server has finished starting")
