#!/usr/bin/env python3
"""`cubridge fleet dashboard` in a real headless browser (Debian's chromium, driven over the
Chrome DevTools Protocol with websocket-client): a live test fleet on a real nats-server (three
cubridge_test_fleet_node processes), the page loads and shows the nodes, updates without a reload
when a wave advances and when a halt happens (n1's health probe fails on v3), and a screenshot is
taken of it.

  dashboard_browser_test.py --tool cubridge --node cubridge_test_fleet_node --kernel k.cu
                            [--screenshot out.png]

Exit status: 0 passed, 1 failed, 77 skipped (no chromium or websocket-client).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float = 30.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class Browser:
    """One headless chromium and its first page, over CDP."""

    def __init__(self, chromium: str, profile: str):
        import websocket  # websocket-client
        self.port = free_port()
        self.process = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--remote-debugging-port={self.port}", f"--user-data-dir={profile}",
             "--window-size=1400,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        targets = wait_for("chromium's DevTools endpoint", self._pages, 30)
        self.socket = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0

    def _pages(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as r:
                return [t for t in json.load(r) if t.get("type") == "page"]
        except OSError:
            return None

    def call(self, method: str, **params):
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def close(self):
        try:
            self.socket.close()
        finally:
            self.process.terminate()
            self.process.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--kernel", required=True, help="a .cu file the publish compiles")
    parser.add_argument("--screenshot")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    nats = shutil.which("nats-server")
    try:
        import websocket  # noqa: F401
    except ImportError:
        print("SKIP: websocket-client is not installed (scripts/setup installs it)")
        return SKIP
    if not chromium or not nats:
        print("SKIP: no chromium or nats-server (scripts/setup installs both)")
        return SKIP

    work = tempfile.mkdtemp(prefix="cubridge-dashboard-")
    processes: list[subprocess.Popen] = []
    browser = None
    try:
        port = free_port()
        url = f"nats://127.0.0.1:{port}"
        processes.append(subprocess.Popen(
            [nats, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", os.path.join(work, "js")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def tool(*argv, check=True, **kw):
            result = subprocess.run([args.tool, *argv], capture_output=True, text=True, **kw)
            if check and result.returncode != 0:
                raise AssertionError(f"cubridge {' '.join(argv)}: exit {result.returncode}\n"
                                     f"{result.stdout}{result.stderr}")
            return result

        op = os.path.join(work, "operator")
        wait_for("nats-server", lambda: tool("keygen", "--out", op, check=False).returncode == 0
                 and socket.create_connection(("127.0.0.1", port), 1).close() is None, 20)
        bus = ["--server", url]
        for i in (1, 2, 3):
            node = f"n{i}"
            key = os.path.join(work, node)
            tool("keygen", "--out", key)
            tool("fleet", "enroll", node, "--node-key", key + ".pub", "--key", op + ".key", *bus)
            node_args = [args.node, "--server", url, "--node", node, "--trusted-key", op + ".pub",
                         "--node-key", key + ".key", "--state-file", key + ".state",
                         "--module", "kernels", "--heartbeat-ms", "200"]
            if i == 1:
                node_args += ["--unhealthy-version", "3"]
            processes.append(subprocess.Popen(node_args, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))

        def publish(version: int, *more):
            return tool("fleet", "publish", args.kernel, "--name", "kernels", "--version",
                        str(version), "--key", op + ".key", "--target", "sm_90", *bus, *more,
                        check=False)

        last = {}

        def first_publish():
            last["result"] = publish(1)
            return last["result"].returncode == 0
        try:
            wait_for("the first publish", first_publish, 30, 0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}: {last['result'].stdout}{last['result'].stderr}") from None
        web_port = free_port()
        dashboard = subprocess.Popen(
            [args.tool, "fleet", "dashboard", "--listen", f"127.0.0.1:{web_port}", "--key",
             op + ".key", *bus], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        processes.append(dashboard)
        page_url = f"http://127.0.0.1:{web_port}/"
        wait_for("the dashboard", lambda: _get(page_url), 20)

        browser = Browser(chromium, os.path.join(work, "profile"))
        browser.call("Page.enable")
        browser.call("Page.navigate", url=page_url)
        # The page loads and shows the three nodes, each on v1, live.
        wait_for("the nodes on the page", lambda: browser.evaluate(
            "document.querySelectorAll('#nodes tr[data-node]').length") == 3)
        wait_for("every node on v1", lambda: browser.evaluate(
            "document.querySelectorAll('td[data-module=kernels] .version[data-version=\"1\"]')"
            ".length") == 3)
        assert browser.evaluate("document.getElementById('link').textContent") == "live"
        resources = browser.evaluate(
            "performance.getEntriesByType('resource').map(e => e.name)"
            ".filter(n => !n.startsWith(location.origin))")
        assert resources == [], f"the page loaded something from elsewhere: {resources}"

        # v2 through two waves: the page shows wave 1 running, then done, without a reload.
        loads = browser.evaluate("performance.getEntriesByType('navigation').length")
        rollout = subprocess.Popen(
            [args.tool, "fleet", "publish", args.kernel, "--name", "kernels", "--version", "2",
             "--key", op + ".key", "--target", "sm_90", *bus, "--waves", "1,50%", "--bake", "2s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for("wave 1 running on the page", lambda: browser.evaluate(
            "!!document.querySelector('.wave[data-wave=\"1\"][data-state=running]')"))
        updates = browser.evaluate("Number(document.body.dataset.updates)")
        wait_for("wave 1 done on the page", lambda: browser.evaluate(
            "!!document.querySelector('.wave[data-wave=\"1\"][data-state=done]')"), 30)
        assert browser.evaluate("Number(document.body.dataset.updates)") > updates
        out, _ = rollout.communicate(timeout=60)
        assert rollout.returncode == 0, out
        wait_for("every node on v2 on the page", lambda: browser.evaluate(
            "document.querySelectorAll('td[data-module=kernels] .version[data-version=\"2\"]')"
            ".length") == 3)

        # v3: n1 (wave 1) says it is unhealthy: the rollout halts, and the page says why.
        halted = publish(3, "--waves", "1,50%", "--bake", "10s")
        assert halted.returncode != 0, halted.stdout + halted.stderr
        assert "health probe" in halted.stderr, halted.stderr
        halt_text = wait_for("the halt on the page", lambda: browser.evaluate(
            "(document.querySelector('[data-role=halt]') || {}).textContent"), 30)
        assert "n1" in halt_text and "health probe" in halt_text, halt_text
        assert browser.evaluate(
            "document.querySelector('.rollout[data-module=kernels]').dataset.phase") == "halted"
        assert browser.evaluate("performance.getEntriesByType('navigation').length") == loads, \
            "the page was reloaded; it must update by itself"
        wait_for("every node back on v2", lambda: browser.evaluate(
            "document.querySelectorAll('td[data-module=kernels] .version[data-version=\"2\"]')"
            ".length") == 3, 30)
        if args.screenshot:
            shot = browser.call("Page.captureScreenshot", format="png")
            with open(args.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        print("dashboard in chromium: loads, shows 3 nodes, updates live on a wave and on a halt")
        return 0
    except AssertionError as e:
        print(f"FAILED: {e}")
        return 1
    finally:
        if browser:
            browser.close()
        for p in reversed(processes):
            p.terminate()
        for p in processes:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


def _get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
