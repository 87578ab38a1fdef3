"""A small W3C WebDriver client over urllib, for the status page's browser test (tests/real/test_page_browser.py):
Debian's ``chromedriver`` (package chromium-driver) started on a free port, driving Debian's ``chromium`` headless.

Only what that test needs: open a session, navigate, find elements by CSS, type, click, read text and attributes,
run a script, take a screenshot, and read the browser's console log (``goog:loggingPrefs``), where Chromium reports
console errors and every Content-Security-Policy violation.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from e2e_helpers import free_port, stop_process

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference


class WebDriverError(AssertionError):
    pass


def browser_paths() -> tuple[str, str] | None:
    """(chromium, chromedriver) where both are installed (.ci/setup-host installs them), else None."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


class Browser:
    """One headless Chromium session through its own chromedriver process."""

    def __init__(self, *, javascript: bool = True, width: int = 1280, height: int = 1700):
        paths = browser_paths()
        if paths is None:
            raise WebDriverError("chromium and chromedriver are needed (apt-get install chromium chromium-driver)")
        binary, driver = paths
        self.port = free_port()
        self.driver = subprocess.Popen(
            [driver, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (OSError, WebDriverError):
                pass
            if time.monotonic() > deadline:
                stop_process(self.driver)
                raise WebDriverError("chromedriver did not answer within 20 s")
            time.sleep(0.05)
        args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--window-size={width},{height}",
            "--no-first-run",
            "--disable-extensions",
        ]
        options: dict[str, Any] = {"binary": binary, "args": args}
        if not javascript:
            options["prefs"] = {"profile.managed_default_content_settings.javascript": 2}
        caps = {
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": options,
                    "goog:loggingPrefs": {"browser": "ALL"},
                }
            }
        }
        try:
            self.session = self._call("POST", "/session", caps)["sessionId"]
        except BaseException:
            stop_process(self.driver)
            raise

    def _call(self, method: str, path: str, body: Any = None, *, timeout: float = 60) -> Any:
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)["value"]
            except (ValueError, KeyError, TypeError):
                err = raw[:500]
            raise WebDriverError(f"{method} {path}: {exc.code} {err}") from None
        return answer.get("value")

    def _s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    # -- navigation and elements

    def get(self, url: str) -> None:
        self._call("POST", self._s("/url"), {"url": url})

    @property
    def url(self) -> str:
        return str(self._call("GET", self._s("/url")))

    def find(self, css: str) -> str:
        return str(self._call("POST", self._s("/element"), {"using": "css selector", "value": css})[ELEMENT])

    def finds(self, css: str) -> list[str]:
        found = self._call("POST", self._s("/elements"), {"using": "css selector", "value": css})
        return [str(e[ELEMENT]) for e in found]

    def click(self, css: str) -> None:
        self._call("POST", self._s(f"/element/{self.find(css)}/click"))

    def submit(self, css: str, *, to: str, timeout: float = 30) -> None:
        """Click a form's button and wait until the page it leads to (its URL ends with ``to``) has loaded."""
        self.click(css)
        self.wait(
            lambda: self.url.endswith(to) and self.script("return document.readyState") == "complete",
            timeout=timeout,
            what=f"{to} after clicking {css}",
        )

    def type(self, css: str, text: str) -> None:
        el = self.find(css)
        self._call("POST", self._s(f"/element/{el}/clear"))
        self._call("POST", self._s(f"/element/{el}/value"), {"text": text})

    def select(self, css: str, value: str) -> None:
        self.click(f'{css} option[value="{value}"]')

    def text(self, css: str) -> str:
        return str(self._call("GET", self._s(f"/element/{self.find(css)}/text")))

    def attr(self, css: str, name: str) -> str | None:
        value = self._call("GET", self._s(f"/element/{self.find(css)}/attribute/{name}"))
        return None if value is None else str(value)

    def attrs(self, css: str, *names: str) -> list[tuple[str | None, ...]]:
        """The attributes ``names`` of every element ``css`` finds, by WebDriver's own element reads (no page script:
        these work with the page's JavaScript off too)."""
        out = []
        for el in self.finds(css):
            out.append(tuple(self._call("GET", self._s(f"/element/{el}/attribute/{n}")) for n in names))
        return out

    def script(self, source: str, *args: Any) -> Any:
        return self._call("POST", self._s("/execute/sync"), {"script": source, "args": list(args)})

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", self._s("/screenshot"))))

    def console(self) -> list[dict[str, Any]]:
        """The console's entries since the last call (level, message): errors, CSP violations, failed loads."""
        return list(self._call("POST", self._s("/se/log"), {"type": "browser"}) or [])

    def wait(self, predicate: Any, *, timeout: float, what: str, every: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = predicate()
            except WebDriverError:
                got = None
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(every)

    def close(self) -> None:
        with contextlib.suppress(OSError, WebDriverError):
            self._call("DELETE", self._s(""), timeout=20)
        stop_process(self.driver)
