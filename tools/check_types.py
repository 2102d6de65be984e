"""Fail when mypy finds a type error in ``runner/``, checked for Python 3.9 with the settings of ``mypy.ini``.

mypy is a dev tool, never a dependency of the runner: it is installed here,
pinned (:data:`MYPY`, the last release that still checks for Python 3.9), into
a virtual environment of its own under ``$RUNNER_TEST_CACHE`` (the cache CI
shares between its steps), made on the first run and reused after; when that
variable is unset, into a temporary folder removed at the end. mypy's own
cache goes there too, so nothing is written into the repository. Prints
mypy's report and exits with its status: 0 when it found nothing, 1 when it
found errors, 2 when it could not run (and so when mypy cannot be installed).
Needs Python 3.10 or newer to run mypy, which checks the code for 3.9.

    python3 tools/check_types.py
"""

import os
import shutil
import subprocess
import sys
import tempfile

#: The mypy release the check runs: 2.x refuses ``python_version = 3.9``.
MYPY = "mypy==1.20.2"
#: The repository: where ``mypy.ini`` and ``runner/`` are.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mypy_python(cache: str) -> str:
    """The interpreter of a venv under ``cache`` that holds :data:`MYPY`, made and filled when it is not there yet.

    :raises RuntimeError: the venv cannot be made or mypy cannot be installed (pip's last line says why).
    """
    folder = os.path.join(cache, MYPY.replace("==", "-"))
    python = os.path.join(folder, "bin", "python")
    done = os.path.join(folder, ".installed")  # written last: a venv left half made is made again
    if os.path.exists(done):
        return python
    for step in ([sys.executable, "-m", "venv", "--clear", folder],
                 [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", MYPY]):
        proc = subprocess.run(step, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [line for line in (proc.stderr or proc.stdout).splitlines()
                     if line.strip() and not line.startswith("WARNING")]
            raise RuntimeError(f"cannot install {MYPY}: {lines[-1] if lines else f'exit {proc.returncode}'}")
    with open(done, "w", encoding="utf-8") as marker:
        marker.write(MYPY + "\n")
    return python


def main() -> int:
    if sys.version_info < (3, 10):
        print(f"type check: {MYPY} runs on Python 3.10 or newer, not {sys.version.split()[0]}", file=sys.stderr)
        return 2
    shared = os.environ.get("RUNNER_TEST_CACHE")
    cache = shared or tempfile.mkdtemp(prefix="runner-check-types-")
    try:
        os.makedirs(cache, exist_ok=True)
        try:
            python = mypy_python(cache)
        except RuntimeError as exc:
            print(f"type check: {exc}", file=sys.stderr)
            return 2
        command = [python, "-m", "mypy", "--config-file", os.path.join(ROOT, "mypy.ini"),
                   "--cache-dir", os.path.join(cache, "mypy-cache")]
        return subprocess.run(command, cwd=ROOT).returncode
    finally:
        if not shared:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
