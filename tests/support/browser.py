"""Headless Chromium driven over the DevTools protocol on a pipe, and a PNG reader: standard library only.

:func:`load_pages` starts ``chromium --remote-debugging-pipe`` (the protocol
runs over file descriptors 3 and 4, one NUL-terminated JSON message each),
opens each page from disk, waits for its load event, and returns a
screenshot and every error the page raised: console errors, uncaught exceptions and log
entries of level error (a resource that failed to load is one).
:func:`evaluate_pages` asks each laid-out page an expression instead
(:data:`TEXT_BOXES`: where every label of a timeline was drawn), and
:func:`overlapping` says which of those boxes overlap.
:func:`png_pixels` decodes an 8-bit RGB or RGBA PNG with :mod:`zlib`.
"""

import base64
import fcntl
import json
import os
import selectors
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from typing import Any, Dict, List, Optional, Tuple

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--remote-debugging-pipe"]


def find_chromium() -> Optional[str]:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: List[Dict[str, Any]] = []
        self.selector = selectors.DefaultSelector()
        self.selector.register(read_fd, selectors.EVENT_READ)

    def send(self, method: str, params: Optional[Dict[str, Any]] = None, session: Optional[str] = None) -> int:
        self.next_id += 1
        message: Dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode("utf-8") + b"\0"
        while data:
            data = data[os.write(self.write_fd, data):]
        return self.next_id

    def _read(self, deadline: float) -> Dict[str, Any]:
        while b"\0" not in self.buffer:
            if not self.selector.select(max(0.0, deadline - time.monotonic())):
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message.decode("utf-8"))

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, session: Optional[str] = None, timeout: float = 30) -> Dict[str, Any]:
        ident = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            message = self._read(deadline)
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_event(self, name: str, timeout: float = 30) -> Dict[str, Any]:
        for event in self.events:
            if event["method"] == name:
                return event
        deadline = time.monotonic() + timeout
        while True:
            message = self._read(deadline)
            if "method" in message:
                self.events.append(message)
                if message["method"] == name:
                    return message


def _errors(events: List[Dict[str, Any]]) -> List[str]:
    out = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            out.append("exception: " + str(params.get("exceptionDetails", {}).get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            out.append(f"log ({params['entry'].get('source')}): {params['entry'].get('text')}")
    return out


def load_pages(chromium: str, pages: List[Tuple[str, str]], width: int = 1200, height: int = 900,
               timeout: float = 60) -> Tuple[List[Tuple[bytes, List[str]]], str]:
    """``([(png, errors) for each page], version)``: each ``(file, media)`` opened in turn, in its own tab of one headless Chromium.

    ``media`` is ``screen`` or ``print`` (the page as it is laid out for printing).
    """
    found, version = _visit(chromium, pages, width, height, timeout, None)
    return [(png, errors) for png, errors, _value in found], version


def evaluate_pages(chromium: str, pages: List[str], expression: str, width: int = 1200, height: int = 900,
                   timeout: float = 60) -> Tuple[List[Any], str]:
    """``([value for each page], version)``: ``expression`` (JavaScript) evaluated in each page once it loaded.

    The pages hold no script of their own: the expression is the browser's
    DevTools protocol asking the laid-out page (the boxes the browser drew).
    """
    found, version = _visit(chromium, [(page, "screen") for page in pages], width, height, timeout, expression)
    return [value for _png, _errors, value in found], version


#: The drawn box of every label of every timeline drawing on a page: its text, its drawing, its sides.
TEXT_BOXES = """(() => Array.from(document.querySelectorAll("section.run svg")).flatMap((svg, index) =>
  Array.from(svg.querySelectorAll("text")).map(node => {
    const box = node.getBoundingClientRect(), frame = svg.getBoundingClientRect();
    return {text: node.textContent, svg: index, left: box.left, top: box.top, right: box.right, bottom: box.bottom,
            inside: box.left >= frame.left - 0.5 && box.right <= frame.right + 0.5 && box.top >= frame.top - 0.5
                    && box.bottom <= frame.bottom + 0.5};
  })))()"""


def overlapping(boxes: List[Dict[str, Any]], slack: float = 0.5) -> List[Tuple[str, str]]:
    """The pairs of labels (of one drawing) whose drawn boxes overlap by more than ``slack`` pixels both ways."""
    pairs = []
    ordered = sorted(boxes, key=lambda b: (b["svg"], b["top"]))
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if b["svg"] != a["svg"] or b["top"] >= a["bottom"] - slack:
                break  # sorted by drawing, then by top: nothing later reaches a
            if min(a["right"], b["right"]) - max(a["left"], b["left"]) > slack:
                pairs.append((a["text"], b["text"]))
    return pairs


def _visit(chromium: str, pages: List[Tuple[str, str]], width: int, height: int, timeout: float,
           expression: Optional[str]) -> Tuple[List[Tuple[bytes, List[str], Any]], str]:
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    profile = tempfile.mkdtemp(prefix="runner-chromium-")

    def child() -> None:  # the protocol's ends on descriptors 3 and 4 of the browser
        reading = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        writing = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        os.dup2(reading, 3)
        os.dup2(writing, 4)

    proc = subprocess.Popen([chromium] + FLAGS + [f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False, preexec_fn=child)
    os.close(to_browser_r)
    os.close(from_browser_w)
    pipe = _Pipe(to_browser_w, from_browser_r)
    try:
        version = pipe.call("Browser.getVersion", timeout=timeout)["product"].split("/")[-1]
        results = []
        for page, media in pages:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
                pipe.call(domain, session=session)
            pipe.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
            pipe.call("Emulation.setEmulatedMedia", {"media": media}, session=session)
            pipe.events.clear()
            pipe.call("Page.navigate", {"url": "file://" + os.path.abspath(page)}, session=session)
            pipe.wait_event("Page.loadEventFired", timeout)
            value = None
            if expression is not None:
                asked = {"expression": expression, "returnByValue": True}
                answer = pipe.call("Runtime.evaluate", asked, session=session, timeout=timeout)
                value = answer.get("result", {}).get("value")
                png = b""
            else:
                shot = pipe.call("Page.captureScreenshot", {"format": "png"}, session=session, timeout=timeout)
                png = base64.b64decode(shot["data"])
            results.append((png, _errors([e for e in pipe.events if e.get("sessionId") == session]), value))
        try:
            pipe.send("Browser.close")
        except OSError:
            pass
        return results, version
    finally:
        for fd in (to_browser_w, from_browser_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def png_pixels(data: bytes) -> Tuple[int, int, int, bytearray]:
    """``(width, height, bytes per pixel, pixels)`` of an 8-bit RGB or RGBA PNG, unfiltered."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat = 8, []
    width = height = channels = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if depth != 8 or colour not in (2, 6):
                raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    out = bytearray(height * stride)
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(channels, stride):
                row[i] = (row[i] + row[i - channels]) & 0xFF
        elif kind == 2:
            row = bytearray((a + b) & 0xFF for a, b in zip(row, previous))
        elif kind == 3:
            for i in range(stride):
                left = row[i - channels] if i >= channels else 0
                row[i] = (row[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = row[i - channels] if i >= channels else 0
                b = previous[i]
                c = previous[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out[y * stride:(y + 1) * stride] = row
        previous = row
    return width, height, channels, out


def blankness(data: bytes) -> Tuple[int, float]:
    """``(distinct colours, share of pixels that differ from the most common one)`` of a PNG screenshot."""
    width, height, channels, pixels = png_pixels(data)
    counts: Dict[bytes, int] = {}
    step = channels
    for i in range(0, len(pixels), step):
        key = bytes(pixels[i:i + 3])
        counts[key] = counts.get(key, 0) + 1
    background = max(counts.values())
    total = width * height
    return len(counts), (total - background) / total
