#!/usr/bin/env python
"""How long after an edit does `ddpdoctor server` publish its diagnostics?

A benchmark, not a test (it exits 0 once it has measured). It starts `python -m ddpdoctor server`
and talks to it as an editor does: JSON-RPC over the server's stdio, with a minimal client written
here (Content-Length framing), so that no client library's overhead is counted. The document is a
300-line DDP training script (examples/buggy_train.py's bugs, among helpers that import a project
module beside it). After `--warmup` edits, each of `--edits` edits sends the whole new text
(`didChange`, a comment line that changes every time, so nothing can be cached) and the clock
stops when the `publishDiagnostics` for that version arrives.

Floors, measured in this process on the same text after each timed edit (so that both see the same
load): `libcst.parse_module` alone, and the server's own linting call (`DocumentLinter.lint`, warm)
without the protocol. Medians are quoted; the target is a median ≤ 100 ms from edit to diagnostics.

    python benchmarks/server_latency.py                 # 10 warm-up edits, 50 timed
    python benchmarks/server_latency.py --edits 200
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Optional

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 100.0

HELPER = '''\
import torch


def save_checkpoint(model, path):
    torch.save(model.state_dict(), path)
'''


def document(lines: int = 300) -> str:
    """examples/buggy_train.py with helper functions before it, to `lines` lines."""
    body = (ROOT / "examples" / "buggy_train.py").read_text(encoding="utf-8")
    head, main = body.split("\ndef main() -> None:\n", 1)
    head += "from ckpt import save_checkpoint\n\n"
    helpers: list[str] = []
    index = 0
    while len((head + "".join(helpers) + main).splitlines()) + 10 < lines:
        helpers.append(
            f"\ndef evaluate_{index}(model, loader, device):\n"
            f"    model.eval()\n"
            f"    total, correct = 0, 0\n"
            f"    with torch.no_grad():\n"
            f"        for images, target in loader:\n"
            f"            output = model(images.to(device))\n"
            f"            correct += (output.argmax(1) == target.to(device)).sum().item()\n"
            f"            total += target.numel()\n"
            f"    return correct / max(total, 1)\n"
        )
        index += 1
    text = head + "".join(helpers) + "\n\ndef main() -> None:\n" + main
    text = text.replace('    torch.save(model.module.state_dict(), "checkpoint.pt")',
                        '    save_checkpoint(model.module, "checkpoint.pt")')
    pad = lines - len(text.splitlines())
    return text + "".join(f"# padding {i}\n" for i in range(max(pad, 0)))


class Client:
    """Just enough JSON-RPC over stdio to open, change and wait for diagnostics."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        self.process = subprocess.Popen(command, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdin and self.process.stdout
        self.stdin: IO[bytes] = self.process.stdin
        self.stdout: IO[bytes] = self.process.stdout
        self.next_id = 0

    def send(self, method: str, params: Any, request: bool = False) -> Optional[int]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        ident = None
        if request:
            self.next_id += 1
            ident = message["id"] = self.next_id
        body = json.dumps(message).encode("utf-8")
        self.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.stdin.flush()
        return ident

    def receive(self) -> dict[str, Any]:
        length = 0
        while True:
            line = self.stdout.readline()
            if not line:
                raise RuntimeError("the server closed its output")
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode("ascii").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        message: dict[str, Any] = json.loads(self.stdout.read(length))
        return message

    def wait_for(self, predicate: Any) -> dict[str, Any]:
        while True:
            message = self.receive()
            if predicate(message):
                return message

    def close(self) -> None:
        ident = self.send("shutdown", None, request=True)
        self.wait_for(lambda m: m.get("id") == ident)
        self.send("exit", None)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def measure(edits: int, warmup: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder)
        (project / "pyproject.toml").write_text("[tool.ddpdoctor]\n")
        (project / "ckpt.py").write_text(HELPER)
        path = project / "train.py"
        text = document()
        path.write_text(text)
        uri = path.as_uri()
        client = Client([sys.executable, "-m", "ddpdoctor", "server"], project)
        try:
            ident = client.send("initialize", {"processId": None, "rootUri": project.as_uri(), "capabilities": {}},
                                request=True)
            client.wait_for(lambda m: m.get("id") == ident)
            client.send("initialized", {})
            client.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                                  "text": text}})
            first = client.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics")
            codes = sorted(d["code"] for d in first["params"]["diagnostics"])
            times: list[float] = []
            floors = Floors(path, text)
            for version in range(2, 2 + warmup + edits):
                changed = text + f"# edit {version}\n"
                start = time.perf_counter()
                client.send("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                                       "contentChanges": [{"text": changed}]})
                client.wait_for(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                                and m["params"].get("version") == version)
                if version >= 2 + warmup:
                    times.append(time.perf_counter() - start)
                    floors.measure(changed)  # interleaved: the same load for the server and its floors
        finally:
            client.close()
    return {"codes": codes, "lines": len(text.splitlines()), "times": times,
            "parse_median": statistics.median(floors.parse), "lint_median": statistics.median(floors.lint)}


class Floors:
    """`libcst.parse_module` alone, and the server's linting call without the protocol, in this
    process on the same text."""

    def __init__(self, path: Path, text: str) -> None:
        from ddpdoctor.lsp.linting import DocumentLinter

        self.path = path
        self.linter = DocumentLinter()
        self.linter.lint(path, text)  # warm: settings read, project module parsed
        self.parse: list[float] = []
        self.lint: list[float] = []

    def measure(self, text: str) -> None:
        import libcst

        start = time.perf_counter()
        libcst.parse_module(text)
        self.parse.append(time.perf_counter() - start)
        start = time.perf_counter()
        self.linter.lint(self.path, text)
        self.lint.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edits", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    options = parser.parse_args()
    result = measure(options.edits, options.warmup)
    times = sorted(result["times"])
    median = statistics.median(times) * 1000
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; "
          f"a {result['lines']}-line document with {', '.join(result['codes'])}; "
          f"{len(times)} edits after {options.warmup} warm-up edits")
    print(f"edit -> diagnostics   median {median:7.1f} ms   min {times[0] * 1000:7.1f} ms   "
          f"max {times[-1] * 1000:7.1f} ms   (target <= {TARGET_MS:.0f} ms: {'met' if median <= TARGET_MS else 'MISSED'})")
    print(f"floor: libcst parse   median {result['parse_median'] * 1000:7.1f} ms   "
          f"server / parse = {median / (result['parse_median'] * 1000):.2f}")
    print(f"in-process lint       median {result['lint_median'] * 1000:7.1f} ms   "
          f"protocol overhead = {median - result['lint_median'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
