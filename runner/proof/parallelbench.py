"""``bench --parallel``: ``drive`` with many calls in flight against a loopback target that answers after a fixed
latency.

Each form runs one ``drive --parallel N`` process over a fresh workspace of
``items`` reports against the loopback helpdesk (:mod:`runner.proof.helpdesk`,
served from this process, answering every request after ``latency``
seconds, no other fault), and is measured in the same run:

* ``http``: the contract's ``effects.http`` (calls made in the ``drive``
  process, lookups of many keys at once with ``observe.many``);
* ``commands``: the same job as ``invoke``/``observe`` commands, two POSIX
  shell scripts around ``curl`` (a process per call, one lookup per key).

For each: the wall time against the ideal (``items * latency / N``: one call
per item, all N slots busy), the calls made, the transitions per commit (a
commit is one fsync), and the CPU of ``drive`` and every process it waited
for (``resource.getrusage`` of the children) per item. A third run drives the
``http`` form against a helpdesk that allows ``rate_limit`` requests a
second and answers 429 above it: the rate ``drive`` settled at, the 429s it
met and the items that failed (which must be none). Every run checks the
target holds exactly one issue per item. Standard library only (and
``curl``, for the command form); made in a temporary folder and removed.
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from ..contract.text import load_contract
from . import PACKAGE_PARENT
from .helpdesk import Faults, Helpdesk, HelpdeskServer

__all__ = ["run_parallel_bench"]

TOKEN = "bench-token-61f0a9"
_ROOT = PACKAGE_PARENT
TEMPLATE = os.path.join(_ROOT, "templates", "run-contract.http.example.md")

INVOKE_SH = r'''#!/bin/sh
# invoke.sh URL PAYLOAD_FILE: POST the payload with curl; print the issue (exit 0), or the runner's exit code for
# the answer.
# Only curl is a program of its own: the token, the status and the body are taken apart by the shell.
read -r token < .helpdesk-token || exit 75
answer=$(curl -sS --noproxy '*' --max-time 20 -w '\n%{http_code}' -X POST \
  -H "Authorization: Bearer $token" -H 'Content-Type: application/json' --data-binary @"$2" "$1/api/issues")
sent=$?
[ "$sent" -eq 7 ] && exit 75
[ "$sent" -eq 0 ] || exit 3
nl='
'
code=${answer##*$nl}
case "$code" in
  2??) printf '%s\n' "${answer%$nl*}"; exit 0 ;;
  429|503) exit 75 ;;
  412) exit 9 ;;
  4??) exit 2 ;;
  *) exit 3 ;;
esac
'''

OBSERVE_SH = r'''#!/bin/sh
# observe.sh URL SLUG: look the issue up by external_ref with curl; 0 and the issues found, 1 none, 3 cannot tell.
read -r token < .helpdesk-token || exit 3
answer=$(curl -sS --noproxy '*' --max-time 20 -w '\n%{http_code}' \
  -H "Authorization: Bearer $token" "$1/api/issues?external_ref=$2") || exit 3
nl='
'
[ "${answer##*$nl}" = 200 ] || exit 3
body=${answer%$nl*}
[ "$body" = "[]" ] && exit 1
printf '{"issues": %s}\n' "$body"
exit 0
'''

OBSERVE_MANY_SH = r'''#!/bin/sh
# observe-many.sh URL SLUG...: look many issues up by external_ref with one GET; the helpdesk's list (exit 0),
# 75 not now, 3 cannot tell.
url=$1
shift
read -r token < .helpdesk-token || exit 3
query=
for slug; do query="$query&external_ref=$slug"; done
answer=$(curl -sS --noproxy '*' --max-time 20 -w '\n%{http_code}' -H "Authorization: Bearer $token" \
  "$url/api/issues?${query#&}") || exit 3
nl='
'
case "${answer##*$nl}" in
  200) printf '%s\n' "${answer%$nl*}"; exit 0 ;;
  429|503) exit 75 ;;
  *) exit 3 ;;
esac
'''


def _workspace(folder: str, url: str, items: int, form: str) -> None:
    os.makedirs(os.path.join(folder, "inbox"))
    for n in range(items):
        with open(os.path.join(folder, "inbox", f"report {n:05d}.md"), "w", encoding="utf-8") as handle:
            handle.write(f"# Report {n}\n\nSomething happened on floor {n % 9}.\n")
    with open(os.path.join(folder, ".helpdesk-token"), "w", encoding="utf-8") as handle:
        handle.write(TOKEN + "\n")
    block = load_contract(TEMPLATE)
    effects = dict(block["effects"], settle_seconds=0, max_rate_limited=1000)
    http = json.loads(json.dumps(effects.pop("http")).replace("http://127.0.0.1:8765", url))
    if form == "http":
        effects["http"] = http
    else:
        for name, text in (("invoke.sh", INVOKE_SH), ("observe.sh", OBSERVE_SH), ("observe-many.sh", OBSERVE_MANY_SH)):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        effects["invoke"] = ["sh", "invoke.sh", url, "{payload_file}"]
        effects["observe"] = ["sh", "observe.sh", url, "{slug}"]
        effects["observe_many"] = {"command": ["sh", "observe-many.sh", url, "{each}"], "match": "/external_ref",
                                   "value": "{slug}"}
    block["effects"] = effects
    block["limits"] = {"max_effect_attempts": 3}
    with open(os.path.join(folder, "contract.md"), "w", encoding="utf-8") as handle:
        handle.write("# bench contract\n\n```json run-contract\n" + json.dumps(block, indent=2) + "\n```\n")


def _runner(folder: str, *args: str) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ)
    for name in ("RUNNER_DIR", "RUNNER_STORE", "RUNNER_OWNER", "RUNNER_EPOCH"):
        env.pop(name, None)
    env["PYTHONPATH"] = _ROOT
    return subprocess.run([sys.executable, "-m", "runner", "--dir", os.path.join(folder, ".run"), *args], cwd=folder,
                          env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=3600)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _drive(tmp: str, name: str, url: str, desk: Helpdesk, items: int, form: str, in_flight: int) -> Dict[str, Any]:
    folder = os.path.join(tmp, name)
    _workspace(folder, url, items, form)
    done = _runner(folder, "init", "--contract", "contract.md")
    if done.returncode != 0:
        raise RuntimeError(f"init failed: {done.stderr.strip()}")
    before = sum(desk.by_ref().values())
    cpu, wall = _children_cpu(), time.perf_counter()
    done = _runner(folder, "drive", "--owner", "bench", "--parallel", str(in_flight), "--json")
    wall, cpu = time.perf_counter() - wall, _children_cpu() - cpu
    if done.returncode != 10:
        raise RuntimeError(f"drive ({form}) exited {done.returncode}: {done.stderr.strip()[-1000:]}")
    figures = json.loads(done.stdout)["drive"]
    made = sum(desk.by_ref().values()) - before
    shutil.rmtree(folder, ignore_errors=True)
    return {"form": form, "items": items, "issues_made": made, "wall_seconds": round(wall, 2),
            "cpu_ms_per_item": round(1000 * cpu / items, 2),
            "calls": figures["calls"], "commits": figures["commits"], "records": figures["records"],
            "records_per_commit": round(figures["records"] / max(1, figures["commits"]), 2),
            "not_now": figures["not_now"]}


def run_parallel_bench(items: int = 2000, in_flight: int = 32, latency: float = 0.1, rate_items: int = 300,
                       rate_limit: float = 50.0, forms: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the benchmark (see the module docstring); its figures, with ``ok`` only when every target holds one issue per
    item."""
    forms = forms or (["http", "commands"] if shutil.which("curl") and shutil.which("sh") else ["http"])
    tmp = tempfile.mkdtemp(prefix="runner-bench-parallel-")
    ideal = items * latency / in_flight
    result: Dict[str, Any] = {"items": items, "in_flight": in_flight, "latency_seconds": latency,
                              "ideal_seconds": round(ideal, 2)}
    try:
        for form in forms:
            desk = Helpdesk(TOKEN, Faults(latency=latency))
            with HelpdeskServer(desk) as served:
                row = _drive(tmp, form, served.url, desk, items, form, in_flight)
            row["over_ideal"] = round(row["wall_seconds"] / ideal, 2)
            result[form] = row
        desk = Helpdesk(TOKEN, Faults(latency=latency, rate_limit=rate_limit))
        with HelpdeskServer(desk) as served:
            row = _drive(tmp, "rate", served.url, desk, rate_items, "http", in_flight)
        row["rate_limit_per_second"] = rate_limit
        row["settled_items_per_second"] = round(rate_items / row["wall_seconds"], 1)
        row["requests_per_second"] = round((row["calls"] + row["not_now"]) / row["wall_seconds"], 1)
        row["failed_items"] = rate_items - row["issues_made"]
        result["rate_limited"] = row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if "commands" in result and "http" in result:
        result["cpu_commands_over_http"] = round(result["commands"]["cpu_ms_per_item"]
                                                 / result["http"]["cpu_ms_per_item"], 2)
    rows = [result[f] for f in forms] + [result["rate_limited"]]
    result["ok"] = all(r["issues_made"] == r["items"] for r in rows)
    result["targets"] = {
        **({"http_over_ideal": {"target": 1.5, "met": result["http"]["over_ideal"] <= 1.5},
            "http_records_per_commit": {"target": 4, "met": result["http"]["records_per_commit"] >= 4}}
           if "http" in result else {}),
        **({"commands_over_ideal": {"target": 3.0, "met": result["commands"]["over_ideal"] <= 3.0}}
           if "commands" in result else {}),
        "rate_limited_failed_items": {"target": 0, "met": result["rate_limited"]["failed_items"] == 0},
    }
    return result
