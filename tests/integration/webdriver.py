"""A W3C WebDriver client of a few calls, enough to drive Debian's headless Chromium through its
chromedriver (/usr/bin/chromedriver) from a test: no Selenium dependency, the protocol is JSON
over HTTP. The browser and its driver are killed when the context ends."""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Headless Chromium as root on a closed network (docs of this machine; without the background
# networking flags it keeps trying to reach Google's hosts).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--hide-scrollbars"]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def require_chromium() -> None:
    """Skips without Chromium (fails under CI=true, where .ci/run installs it)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        message = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Browser:
    """One headless Chromium session. Context manager."""

    def __init__(self, width: int = 1280, height: int = 1000, timeout_s: float = 30):
        require_chromium()
        self.port = _free_port()
        self.profile = tempfile.mkdtemp(prefix="trainfeed-chromium-")
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        self.session = ""
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if self._call("GET", "/status").get("ready"):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"chromedriver not ready within {timeout_s:g} s")
                time.sleep(0.1)
            answer = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:chromeOptions": {
                    "binary": CHROMIUM,
                    "args": [*CHROMIUM_ARGS, f"--user-data-dir={self.profile}",
                             f"--window-size={width},{height}"]}}}})
            self.session = answer["sessionId"]
        except BaseException:
            self.close()
            raise

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return json.load(answer)["value"]
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"WebDriver {method} {path}: {e.read().decode()[:500]}") from None

    def _s(self, method: str, path: str, body: Any = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        self._s("POST", "/url", {"url": url})

    def find(self, css: str) -> str:
        return str(self._s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT])

    def type(self, css: str, text: str) -> None:
        self._s("POST", f"/element/{self.find(css)}/value", {"text": text})

    def click(self, css: str) -> None:
        self._s("POST", f"/element/{self.find(css)}/click", {})

    def wait_until(self, shown: Callable[[Browser], bool], timeout_s: float = 15.0) -> None:
        """Waits until `shown(self)`: a click's navigation may end after the click's answer
        (a form's POST and its redirect), and the page read at once is the old one."""
        deadline = time.monotonic() + timeout_s
        while not shown(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"not shown within {timeout_s:g} s; at {self.url}: "
                                     f"{self.source[-500:]}")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return str(self._s("GET", "/url"))

    @property
    def source(self) -> str:
        return str(self._s("GET", "/source"))

    def script(self, body: str) -> Any:
        return self._s("POST", "/execute/sync", {"script": body, "args": []})

    def resize(self, width: int, height: int) -> None:
        self._s("POST", "/window/rect", {"width": width, "height": height})

    def screenshot(self) -> bytes:
        return base64.b64decode(self._s("GET", "/screenshot"))

    def close(self) -> None:
        try:
            if self.session:
                self._s("DELETE", "")
        except Exception:
            pass
        self.driver.kill()
        self.driver.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
