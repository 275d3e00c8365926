"""Finding the `resource-tracker` executable and running its one-shot commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from .errors import BinaryNotFoundError, TrackerError

DIST_NAME = "resource-tracker-ebpf"
EXE = "resource-tracker"
ENV_VAR = "RESOURCE_TRACKER_BINARY"


def _from_distribution() -> Optional[Path]:
    """The executable this package's wheel installed, wherever pip put the scripts
    (a venv's bin/, ~/.local/bin with --user, a --prefix)."""
    # Imported here: importlib.metadata costs the tracked interpreter ~10 ms, and
    # the cheap places below usually answer first.
    try:
        from importlib.metadata import PackageNotFoundError, distribution
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        dist = distribution(DIST_NAME)
    except PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == EXE:
            p = Path(str(dist.locate_file(f))).resolve()
            if _executable(p):
                return p
    return None


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_binary(explicit: Optional[str] = None) -> Path:
    """The tracker executable: `explicit`, else $RESOURCE_TRACKER_BINARY, else the one
    next to this interpreter (a venv's bin/, where pip puts the wheel's scripts),
    else the one the installed distribution lists (--user, --prefix installs), else
    PATH. Raises BinaryNotFoundError naming every place it looked."""
    tried: List[str] = []
    for label, cand in (
        ("binary=", explicit),
        (f"${ENV_VAR}=", os.environ.get(ENV_VAR)),
    ):
        if cand:
            # A binary named explicitly is the one wanted: no silent fallback.
            p = Path(cand)
            if _executable(p):
                return p
            raise BinaryNotFoundError(f"{label}{cand}: not an executable file")
    beside = Path(sys.executable).parent / EXE
    if _executable(beside):
        return beside
    tried.append(str(beside))
    p = _from_distribution()
    if p:
        return p
    tried.append(f"the files of the installed {DIST_NAME} distribution")
    import shutil

    which = shutil.which(EXE)
    if which:
        return Path(which)
    tried.append("PATH")
    raise BinaryNotFoundError(
        f"no `{EXE}` executable found (looked at: {'; '.join(tried)}). "
        f"Install the {DIST_NAME} wheel into this environment ({sys.executable}) "
        f"or set {ENV_VAR} to the binary's path."
    )


def run_once(binary: Path, args: Sequence[str], timeout: float = 120.0) -> str:
    """Run a one-shot subcommand (e.g. `report`) and return its stdout; a failure,
    a timeout or a signal is a TrackerError carrying the tool's own message."""
    try:
        cp = subprocess.run(
            [str(binary), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        # subprocess.run kills and reaps the child on timeout: nothing is left behind.
        raise TrackerError(f"`{EXE} {' '.join(args)}` did not finish in {timeout:.0f} s") from e
    except OSError as e:
        raise BinaryNotFoundError(f"cannot execute {binary}: {e}") from e
    if cp.returncode != 0:
        why = cp.stderr.strip() or cp.stdout.strip() or "no message"
        if cp.returncode < 0:
            why = f"killed by signal {-cp.returncode}; {why}"
        raise TrackerError(f"`{EXE} {' '.join(args)}` failed (exit {cp.returncode}): {why}")
    return cp.stdout
