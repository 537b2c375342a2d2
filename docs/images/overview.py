#!/usr/bin/env python3
"""Takes docs/images/overview.png, the README's picture: the overview page of a running
`gpuledger demo` in headless Chromium (Debian's `chromium` and `chromedriver`, which ./test.sh
installs), signed in with the demo's admin token.

    cargo run --locked -- demo &          # wait for "ready"
    python3 docs/images/overview.py http://127.0.0.1:9836 "$(cat gpuledger-demo/admin-token)"
"""
import base64
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["value"]


def session_cookie(base, token):
    """Signs in as a browser would (same-origin form post) and returns the session cookie."""
    form = urllib.parse.urlencode({"token": token, "next": "/"}).encode()
    req = urllib.request.Request(base + "/signin", data=form, method="POST", headers={
        "Origin": base, "Content-Type": "application/x-www-form-urlencoded"})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        urllib.request.build_opener(NoRedirect).open(req, timeout=30)
    except urllib.error.HTTPError as e:
        if e.code != 303:
            raise
        cookie = e.headers["Set-Cookie"].split(";")[0]
        return cookie.split("=", 1)
    raise SystemExit("sign-in did not answer 303")


def main():
    base, token = sys.argv[1].rstrip("/"), sys.argv[2]
    out = sys.argv[3] if len(sys.argv) > 3 else "docs/images/overview.png"
    name, value = session_cookie(base, token)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    driver = subprocess.Popen(["chromedriver", f"--port={port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wd = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                sid = call("POST", wd + "/session", {"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": [
                        "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--hide-scrollbars", "--window-size=1280,900"]}}}})["sessionId"]
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("chromedriver did not start")
        s = f"{wd}/session/{sid}"
        call("POST", s + "/url", {"url": base + "/signin"})
        call("POST", s + "/cookie", {"cookie": {"name": name, "value": value, "path": "/"}})
        call("POST", s + "/url", {"url": base + "/"})
        png = base64.b64decode(call("GET", s + "/screenshot"))
        with open(out, "wb") as f:
            f.write(png)
        call("DELETE", s)
    finally:
        driver.kill()
    print(f"wrote {out} ({len(png)} bytes)")


if __name__ == "__main__":
    main()
