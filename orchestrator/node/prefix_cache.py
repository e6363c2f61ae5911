"""Empty a vLLM server's prefix cache over HTTP (``POST /reset_prefix_cache``): every window's start state."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request


def reset_prefix_cache(base_url: str, attempts: int = 20, wait_s: float = 0.25) -> bool:
    """POST /reset_prefix_cache until vLLM says it worked. vLLM refuses while blocks are still held
    (a request finishing, a KV transfer), answering ``{"success": false}``; older releases answer a bare 200."""
    for _ in range(attempts):
        req = urllib.request.Request(base_url + "/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
            ok = resp.status == 200
        with contextlib.suppress(ValueError, AttributeError):  # not JSON: the status is all there is
            ok = ok and bool(json.loads(body).get("success", True))
        if ok:
            return True
        time.sleep(wait_s)
    return False


__all__ = ["reset_prefix_cache"]
