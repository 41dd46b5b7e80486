"""Load a page in a real headless Chromium and report what it showed, what it asked the network for,
and what went wrong in it.

Chromium is driven over its DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages
separated by NUL bytes on file descriptors 3 and 4), so no websocket client is needed. The page's own
target reports every request it makes (Network.requestWillBeSent), every script error
(Runtime.exceptionThrown) and every console or browser message, Content-Security-Policy refusals
included (Log.entryAdded): Chromium's own background traffic (component updates, sign-in) is not the
page's and does not show there. All traffic goes to a proxy on an unused loopback address, so that
nothing leaves the machine whatever the page asks for.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest

BLACKHOLE_PROXY = "http://127.0.0.9:9"


def chromium() -> Optional[str]:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    """Chromium's path; skip without it, except in CI (CI=true, or DDPDOCTOR_REQUIRE_CHROMIUM=1 as .ci/run
    sets), where the test must run."""
    found = chromium()
    if found is None:
        if os.environ.get("CI", "").lower() == "true" or os.environ.get("DDPDOCTOR_REQUIRE_CHROMIUM") == "1":
            pytest.fail("chromium is not installed, and CI requires it (apt-get install chromium; .ci/run does)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


@dataclass
class Loaded:
    dom: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: Optional[dict[str, Any]] = None, session: Optional[str] = None) -> int:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        return self.next_id

    def _next(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise EOFError("chromium closed its pipe")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: Optional[dict[str, Any]] = None, session: Optional[str] = None,
             timeout: float = 30) -> dict[str, Any]:
        wanted = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            message = self._next(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_event(self, method: str, session: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        while True:
            message = self._next(deadline)
            self.events.append(message)
            if message.get("method") == method and message.get("sessionId") == session:
                return message


def _high(fds: tuple[int, int]) -> tuple[int, int]:
    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return moved[0], moved[1]


def load(page: Path, expressions: Optional[dict[str, str]] = None, settle: float = 0.5) -> Loaded:
    """Open `page` (a file), let it load and its scripts run, and return its DOM, its requests, its
    errors and messages, and the values of `expressions` evaluated in it."""
    binary = require_chromium()
    with tempfile.TemporaryDirectory() as profile:
        to_chrome_r, to_chrome_w = _high(os.pipe())
        from_chrome_r, from_chrome_w = _high(os.pipe())
        # The pipe's ends must be file descriptors 3 (commands in) and 4 (answers out) in the child;
        # both ends sit above 9, so that putting one in place cannot close the other.
        process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", f"--proxy-server={BLACKHOLE_PROXY}", "--proxy-bypass-list=<-loopback>",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-default-apps", "--disable-dev-shm-usage", "about:blank"],
            pass_fds=(3, 4, to_chrome_r, from_chrome_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(to_chrome_r, 3), os.dup2(from_chrome_w, 4)) and None)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        pipe = _Pipe(to_chrome_w, from_chrome_r)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Network", "Page", "Runtime", "Log"):
                pipe.call(f"{domain}.enable", session=session)
            url = page.resolve().as_uri()
            pipe.call("Page.navigate", {"url": url}, session=session)
            pipe.wait_event("Page.loadEventFired", session)
            time.sleep(settle)  # anything the page would fetch or log after its load
            values = {name: pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                      session=session)["result"].get("value")
                      for name, expression in (expressions or {}).items()}
            dom = pipe.call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML",
                                                 "returnByValue": True}, session=session)["result"]["value"]
            ours = [e for e in pipe.events if e.get("sessionId") == session]
            requests = [e["params"]["request"]["url"] for e in ours if e.get("method") == "Network.requestWillBeSent"]
            errors = [json.dumps(e["params"]["exceptionDetails"]) for e in ours
                      if e.get("method") == "Runtime.exceptionThrown"]
            messages = [e["params"]["entry"]["text"] for e in ours if e.get("method") == "Log.entryAdded"]
            messages += [json.dumps(e["params"].get("args")) for e in ours
                         if e.get("method") == "Runtime.consoleAPICalled"]
            try:
                pipe.call("Browser.close", timeout=10)
            except (EOFError, TimeoutError, RuntimeError):
                pass
            return Loaded(dom, [r for r in requests if r != url], errors, messages, values)
        finally:
            os.close(to_chrome_w)
            os.close(from_chrome_r)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
