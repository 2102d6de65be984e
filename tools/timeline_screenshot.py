"""Regenerate the screenshots of the demo's timeline pages that README.md and BENCHMARKS.md show.

    python3 tools/timeline_screenshot.py [--documents 2000] [--seed 1] [--out docs/timeline-demo.png]
    python3 tools/timeline_screenshot.py --via-cli --documents 20 --crash-rate 0.1 --out docs/timeline-20-items.png
    python3 tools/timeline_screenshot.py --html /tmp/demo.html    # a page 'demo --html' already wrote

Runs the demo (``python3 -m runner demo --html``; with ``--via-cli``, the
batch contract driven by ``drive`` processes alone, one item per document),
then has headless Chromium (the distribution's ``chromium`` package) take a
screenshot of the top of the page. Prints the page's size and the
screenshot's path. Needs Chromium only here; the runner never does.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runner.proof.demo import run_demo  # noqa: E402
from runner.proof.demo_cli import run_demo_cli  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "timeline-demo.png"))
    parser.add_argument("--page", default=None, help="keep the page at this path (default: a temporary file)")
    parser.add_argument("--size", default="1400,1300", help="the browser window, WIDTH,HEIGHT")
    parser.add_argument("--html", default=None, help="take the screenshot of this page instead of running the demo")
    parser.add_argument("--via-cli", action="store_true", help="the demo of a batch contract and 'drive' alone")
    parser.add_argument("--crash-rate", type=float, default=0.01, help="the chance per document of a kill")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.stderr.write("timeline_screenshot: no chromium on the PATH (apt-get install chromium)\n")
        return 2
    scratch = tempfile.mkdtemp(prefix="runner-screenshot-")
    try:
        page = args.html or args.page or os.path.join(scratch, "demo.html")
        if args.html:
            what = f"page {os.path.getsize(page)} bytes"
        else:
            if args.via_cli:
                result = run_demo_cli(args.documents, args.seed, args.crash_rate, html=page)
            else:
                result = run_demo(args.documents, args.seed, args.crash_rate, html=page)
            if not result["ok"]:
                sys.stderr.write(f"timeline_screenshot: the demo failed: {result['errors'][:3]}\n")
                return 1
            what = f"page {result['html_bytes']} bytes ({args.documents} documents, {result['crashes']} crashes)"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--hide-scrollbars", f"--user-data-dir={os.path.join(scratch, 'profile')}",
                        f"--screenshot={os.path.abspath(args.out)}",
                        f"--window-size={args.size}", "file://" + os.path.abspath(page)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
                       check=True)
        print(f"{what}; screenshot {args.out}")
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
