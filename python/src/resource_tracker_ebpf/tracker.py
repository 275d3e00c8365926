"""ResourceTracker: the API of the Python resource-tracker 0.5.0, driven by the
`resource-tracker` binary.

The binary is started with `--pid` (this interpreter by default) and writes JSON
lines, a summary and, with eBPF, the tree's process events into a private temporary
directory. Between samples nothing runs in this interpreter: no thread, no child
process of ours other than the binary; files are read only when data is asked for.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import signal
import subprocess
import time
import weakref
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import columns as C
from ._binary import find_binary, run_once
from .errors import SnapshotError, TrackerDiedError, TrackerError
from .tiny_data_frame import StatSpec

# Modules only some calls need (gzip, logging, re, shutil, tempfile) are imported
# where used: the tracked interpreter pays ~10 ms less for importing the package.

__version__ = "0.1.0"
# Bumped when the snapshot's layout changes; from_snapshot() refuses other versions.
SNAPSHOT_FORMAT = "resource-tracker-ebpf/snapshot"
SNAPSHOT_VERSION = 1

# Live trackers, stopped at interpreter exit so that no binary outlives the job.
_live: "weakref.WeakSet[ResourceTracker]" = weakref.WeakSet()
_said_procfs = False


class Report(str):
    """An HTML report: the page's text, with 0.5.0's save() and browse()."""

    def save(self, filepath: str) -> "Report":
        """Writes the page to `filepath` (as this interpreter's user)."""
        with open(filepath, "w", encoding="utf-8") as f:
            f.write(self)
        return self

    def browse(self) -> "Report":
        """Opens the page in the default web browser, from a private temporary file."""
        import tempfile
        import webbrowser

        fd, name = tempfile.mkstemp(prefix="resource-tracker-report-", suffix=".html")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self)
        webbrowser.open("file://" + name)
        return self


def _stop_all() -> None:
    for t in list(_live):
        # A forked child exiting must not stop its parent's tracker.
        if getattr(t, "_owner", None) != os.getpid():
            continue
        try:
            t.stop()
        except Exception:  # noqa: BLE001 - nothing useful to do at exit
            pass


atexit.register(_stop_all)


def _kill_and_reap(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; always reaps (no zombie)."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def _rmtree(path: Optional[str]) -> None:
    if path:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def _mkdtemp(prefix: str) -> str:
    """A private (0700) new directory under $TMPDIR or /tmp; tempfile's own costs
    imports the tracked interpreter does not otherwise need."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for i in range(100):
        d = os.path.join(base, f"{prefix}{os.getpid()}-{time.monotonic_ns() % 10**9}-{i}")
        try:
            os.mkdir(d, 0o700)
            return d
        except FileExistsError:
            continue
    raise TrackerError(f"cannot make a temporary directory in {base}")


def _finalize(proc: Optional[subprocess.Popen], tmpdir: Optional[str], owner: int, told: Optional[Any]) -> None:
    """Run when a tracker is garbage-collected: no binary, pipe or temporary file
    left (only in the process that started it, not in a forked child)."""
    if os.getpid() != owner:
        return
    if told is not None:
        told.close()
    if proc is not None:
        _kill_and_reap(proc, 2.0)
    _rmtree(tmpdir)


def _children_line() -> bytes:
    """This interpreter's reaped children's CPU (user + system, ns, to the
    microsecond) and largest RSS (KiB). The tracker reads the same CPU from
    /proc in whole clock ticks (10 ms), each floored, which leaves a job whose
    processes all end between two samples off by up to two ticks at each end;
    and no file gives it the largest RSS of a child that peaked and exited
    between two samples."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    ns = (round(ru.ru_utime * 1e6) + round(ru.ru_stime * 1e6)) * 1000
    return f"{ns} {ru.ru_maxrss}\n".encode()


def _tell(pipe: Optional[Any]) -> None:
    """Writes this interpreter's children's account on the binary's pipe
    (TRACKER_ROOT_CHILDREN_FD); a binary that is gone changes nothing."""
    if pipe is None or pipe.closed:
        return
    try:
        pipe.write(_children_line())
    except OSError:
        pass


def _round2(x: float) -> float:
    return round(x, 2)


def round_memory(mib: float) -> int:
    """Rounded up to at least 128 MiB, in steps of an eighth of the power of two
    below (256, 288, 320 ... 512, 576 ...), whole GiB past 8 GiB, as the binary's
    recommendation rounds (model/stats.rs); the Python package's steps (128, 256,
    512, 1024, 2048) asked for up to twice the memory."""
    if not mib > 128:
        return 128
    step = min(2 ** math.floor(math.log2(mib)) / 8, 1024)
    return int(math.ceil(mib / step) * step)


def aggregate_stats(stats: Sequence[Dict[str, Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """Several runs' stats() as one, by the Python package's rules: mean of the means
    and of the durations, max of the maxes and of the sums."""
    out: Dict[str, Dict[str, Any]] = {}
    seen: Dict[str, Dict[str, List[float]]] = {}
    for st in stats:
        for col, aggs in st.items():
            for agg, v in aggs.items():
                if v is None:
                    continue
                if agg in ("mean", "duration"):
                    seen.setdefault(col, {}).setdefault(agg, []).append(v)
                elif agg in ("max", "sum"):
                    cur = out.setdefault(col, {}).get(agg)
                    out[col][agg] = v if cur is None else max(cur, v)
                else:
                    raise ValueError(f"unsupported aggregation {agg!r} in {col!r}")
    for col, aggs in seen.items():
        for agg, vals in aggs.items():
            out.setdefault(col, {})[agg] = sum(vals) / len(vals)
    # Every run's working set, or none: a run without it (recorded before it) must
    # not be left out of the memory advice.
    if not all("process_memory_working_set_mib" in st for st in stats):
        out.pop("process_memory_working_set_mib", None)
        out.pop("page_cache_reread_mib", None)
    return out


def recommend_from_stats(stats: Dict[str, Dict[str, Any]]) -> Dict[str, int]:
    """The recommendation rules of the binary's summary (docs/schema.md
    `recommendation`), for stats combined across runs; a single run's come from the
    binary itself."""
    gpu_mean = stats["process_gpu_usage"]["mean"] or 0.0
    gpu_max = stats["process_gpu_usage"]["max"] or 0.0
    vram_max = stats["process_gpu_vram_mib"]["max"] or 0.0
    # The working set where the runs' cgroups gave it: the page cache a limit
    # reclaims is left out, as the binary's advice leaves it.
    ws = stats.get("process_memory_working_set_mib")
    if ws and ws.get("max") is not None:
        # With the page cache the runs read back: under a smaller limit those
        # reads would go to storage again.
        memory = ws["max"] + ((stats.get("page_cache_reread_mib") or {}).get("max") or 0.0)
    else:
        memory = stats["process_memory_mib"]["max"]
    return {
        # Python's round(): ties to even, as the binary's round_even.
        "cpu": max(1, round(stats["process_cpu_usage"]["mean"])),
        "memory": round_memory(memory * 1.2),
        "gpu": max(1, round(gpu_max)) if gpu_mean > 0 else 0,
        "vram": round_memory(vram_max * 1.2) if vram_max > 0 else 0,
    }


def metaflow_resources(rec: Dict[str, int]) -> str:
    """The recommendation as Metaflow's decorator, as the binary writes it."""
    s = f"@resources(cpu={rec['cpu']}, memory={rec['memory']}"
    if rec.get("gpu"):
        s += f", gpu={rec['gpu']}"
    return s + ")"


def _stats_from_summary(st: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The binary's summary `stats` in the Python package's stats() shape. A column
    the binary leaves null (no GPU) is 0, as the Python package reports it."""

    def mm(v: Optional[Dict[str, float]]) -> Dict[str, float]:
        return {"mean": v["mean"], "max": v["max"]} if v else {"mean": 0.0, "max": 0.0}

    out = {
        "process_cpu_usage": mm(st.get("process_cpu_usage")),
        "process_memory_mib": mm(st.get("process_memory_mib")),
        "process_gpu_usage": mm(st.get("process_gpu_usage")),
        "process_gpu_vram_mib": mm(st.get("process_gpu_vram_mib")),
        "process_gpu_utilized": mm(st.get("process_gpu_utilized")),
        "system_disk_space_used_gb": {"max": st.get("system_disk_space_used_gb") or 0.0},
        "system_net_recv_bytes": {"sum": st.get("system_net_recv_bytes") or 0},
        "system_net_sent_bytes": {"sum": st.get("system_net_sent_bytes") or 0},
        "timestamp": {"duration": st["duration_secs"]},
    }
    if st.get("process_memory_working_set_mib"):
        out["process_memory_working_set_mib"] = mm(st["process_memory_working_set_mib"])
        out["page_cache_reread_mib"] = {"max": st.get("page_cache_reread_mib") or 0.0}
    return out


def working_set(rows: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Dict[str, float]]]:
    """The working set (the cgroup's charge less its inactive page cache) and the
    page cache the tree read back beyond it, as the binary's stats give them
    (model/stats.rs): the working set's peak holds, between samples, the cgroup's
    peak so far less the most page cache a sample saw so far; the page cache read
    back is what the tree read without storage I/O (Σ `rchar_bytes` − Σ
    `read_bytes`, at most the most page cache it had) added to the charge but its
    page cache, less the working set. None where no sample has the working set."""
    vals: List[float] = []
    page_cache = peak = nonfile = rchar = storage = 0.0
    for r in rows:
        ws = r.get("memory_working_set_mib")
        if ws is None:
            continue
        vals.append(ws)
        if r.get("memory_page_cache_mib") is not None:
            page_cache = max(page_cache, r["memory_page_cache_mib"])
        charge_peak = r["memory_peak_mib"] if r.get("memory_peak_mib") is not None else r["memory_mib"]
        between = charge_peak - page_cache
        peak = max(peak, ws, between)
        nonfile = max(nonfile, r["memory_mib"] - (r.get("memory_page_cache_mib") or 0.0), between)
        rchar += (r.get("rchar_bytes") or 0) / 1048576
        storage += (r.get("disk_read_bytes") or 0) / 1048576
    if not vals:
        return None
    reread = min(max(rchar - storage, 0.0), page_cache)
    return {
        "process_memory_working_set_mib": {"mean": _round2(sum(vals) / len(vals)), "max": _round2(peak)},
        "page_cache_reread_mib": {"max": _round2(max(nonfile + reread - peak, 0.0))},
    }


class ResourceTracker:
    """Track a process tree (this interpreter by default) and the host with the
    `resource-tracker` binary, in the background.

    Args (the Python package 0.5.0's, then ours):
        pid: root of the tree to track; default: this interpreter.
        children: must be True: the binary always tracks the whole tree.
        interval: seconds between samples (at least 0.1).
        method: accepted for compatibility; no multiprocessing is involved.
        autostart: start at once.
        track_processes: False samples the host only.
        track_system: accepted for compatibility: the host is always sampled.
        discover_server: the summary's `host` is always read (no network).
        discover_cloud: probe the cloud metadata services (network; default off here).
        ebpf: None lets the binary choose (eBPF as root or with CAP_BPF+CAP_PERFMON,
            else procfs, said once); False forces procfs.
        pss: also put Σ PSS in every sample (`memory_pss_mib`). The memory figures
            are unique pages either way: this interpreter's tree is tracked by pid,
            so the binary reads Σ PSS every sample (`memory_source` "pss"); the
            flag only matters for `run`, where a cgroup is the source.
        job_name, tags: written into the samples and summary.
        recommend_server: ask Spare Cores Keeper at the end of the run (network).
        binary: path of the executable (default: the one installed with this package).
        extra_args: more command-line flags for the binary.
        stop_timeout: seconds stop() waits for the binary's final sample before
            killing it.
        start_timeout: seconds start() waits for the binary to say that it tracks
            (eBPF programs attached and the tree listed, or procfs's first reading
            of it) before killing it and raising.
    """

    def __init__(
        self,
        pid: Optional[int] = None,
        children: bool = True,
        interval: float = 1,
        method: Optional[str] = None,
        autostart: bool = False,
        track_processes: bool = True,
        track_system: bool = True,
        discover_server: bool = True,
        discover_cloud: bool = False,
        *,
        ebpf: Optional[bool] = None,
        pss: bool = False,
        job_name: Optional[str] = None,
        tags: Optional[Dict[str, str]] = None,
        recommend_server: bool = False,
        binary: Optional[str] = None,
        extra_args: Sequence[str] = (),
        stop_timeout: float = 10.0,
        start_timeout: float = 30.0,
    ):
        if not children:
            raise ValueError("children=False is not supported: the binary tracks the whole tree")
        if not (isinstance(interval, (int, float)) and interval >= 0.1):
            raise ValueError(f"interval must be a number of seconds >= 0.1, not {interval!r}")
        if not (isinstance(start_timeout, (int, float)) and start_timeout > 0):
            raise ValueError(f"start_timeout must be a positive number of seconds, not {start_timeout!r}")
        self.pid = os.getpid() if pid is None else int(pid)
        self.children = True
        self.interval = float(interval)
        self.method = method
        self.autostart = autostart
        self.track_processes = track_processes
        self.track_system = track_system
        self.discover_server = discover_server
        self.discover_cloud = discover_cloud
        self.ebpf = ebpf
        self.pss = pss
        self.job_name = job_name
        self.tags = dict(tags or {})
        self._recommend_server = recommend_server
        self._binary_arg = binary
        self.extra_args = list(extra_args)
        self.stop_timeout = stop_timeout
        self.start_timeout = start_timeout

        self.start_time: Optional[float] = None
        self.stop_time: Optional[float] = None
        self._proc: Optional[subprocess.Popen] = None
        # The pipe on which this interpreter, when it is the tracked root, tells
        # the binary its reaped children's CPU (TRACKER_ROOT_CHILDREN_FD).
        self._told: Optional[Any] = None
        self._tmpdir: Optional[str] = None
        self._samples: List[Dict[str, Any]] = []
        self._offset = 0
        self._summary: Optional[Dict[str, Any]] = None
        self._events: Optional[List[Dict[str, Any]]] = None
        self._stderr_tail = ""
        self._exit_code: Optional[int] = None
        self._from_snapshot = False
        self.binary_version: Optional[str] = None
        if autostart:
            self.start()

    # --- life cycle -------------------------------------------------------------

    def _path(self, name: str) -> Path:
        assert self._tmpdir is not None
        return Path(self._tmpdir) / name

    def start(self) -> "ResourceTracker":
        """Start the binary in the background."""
        if self._from_snapshot:
            raise TrackerError("a tracker restored from a snapshot cannot be started")
        if self.running:
            raise TrackerError("the tracker is already running")
        if self.stop_time is not None:
            raise TrackerError("the tracker was stopped: create a new one to track again")
        binary = find_binary(self._binary_arg)
        if self.track_processes and not Path(f"/proc/{self.pid}").is_dir():
            raise TrackerError(f"no process with pid {self.pid} to track")
        self._binary = binary
        self._tmpdir = _mkdtemp("resource-tracker-py-")
        args = [
            str(binary),
            "-i",
            repr(self.interval),
            "-f",
            "json",
            "-q",
            "-o",
            str(self._path("samples.jsonl")),
            "--summary",
            str(self._path("summary.json")),
        ]
        if self.track_processes:
            args += ["--pid", str(self.pid)]
            if self.ebpf is not False:
                args += ["--events", str(self._path("events.jsonl"))]
        if self.ebpf is False:
            args.append("--no-ebpf")
        if self.pss:
            args.append("--pss")
        if self.discover_cloud:
            args.append("--discover")
        if self.job_name:
            args += ["--job-name", self.job_name]
        for k, v in self.tags.items():
            args += ["--tag", f"{k}={v}"]
        if self._recommend_server:
            args.append("--recommend-server")
        args += self.extra_args
        self._stderr = open(self._path("stderr.log"), "wb")
        # The binary writes one line on this pipe once it tracks the tree, and
        # start() returns only then: nothing the job does after start() is missed.
        ready_r, ready_w = os.pipe()
        fds = [ready_w]
        env = {
            **os.environ,
            "TRACKER_STOP_WITH_PARENT": "1",
            # Who started it: a binary whose starter died before it looked is
            # told apart from one started by the reaper that adopted it.
            "TRACKER_PARENT_PID": str(os.getpid()),
            "TRACKER_READY_FD": str(ready_w),
        }
        told_r = None
        if self.track_processes and self.pid == os.getpid():
            # Read now and while start() waits for the binary, which reads the
            # tree: nothing this interpreter reaps falls between the two.
            told_r, told_w = os.pipe()
            self._told = os.fdopen(told_w, "wb", buffering=0)
            _tell(self._told)
            fds.append(told_r)
            env["TRACKER_ROOT_CHILDREN_FD"] = str(told_r)
        try:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=self._stderr,
                stderr=self._stderr,
                # Its own session: a terminal's Ctrl-C stops the job, not the tracker
                # before stop() collects its final sample.
                start_new_session=True,
                close_fds=True,
                pass_fds=tuple(fds),
                # TRACKER_STOP_WITH_PARENT: the binary stops by itself if this
                # interpreter dies (SIGKILL, a crash): no tracker is left attached
                # to a pid that is gone.
                env=env,
            )
        except OSError as e:
            os.close(ready_r)
            self._close_told()
            self._stderr.close()
            _rmtree(self._tmpdir)
            raise TrackerError(f"cannot execute {binary}: {e}") from e
        finally:
            os.close(ready_w)
            if told_r is not None:
                os.close(told_r)
        self.start_time = time.time()
        self._owner = os.getpid()
        self._finalizer = weakref.finalize(self, _finalize, self._proc, self._tmpdir, self._owner, self._told)
        _live.add(self)
        try:
            self._wait_ready(ready_r)
        finally:
            os.close(ready_r)
        return self

    def _wait_ready(self, fd: int) -> None:
        """Waits for the binary's line on the ready pipe. The pipe closing without it
        means the binary is exiting (bad arguments, a vanished pid, no right to
        read it): its exit and stderr are raised. No line in time: killed, raised."""
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        got = b""
        while b"\n" not in got:
            left = deadline - time.monotonic()
            readable = left > 0 and select.select([fd], [], [], left)[0]
            if not readable:
                self._gave_up(
                    f"the resource-tracker binary {self._binary} did not start tracking "
                    f"within start_timeout={self.start_timeout:g} s and was killed"
                )
            chunk = os.read(fd, 64)
            if not chunk:
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._gave_up(
                        f"the resource-tracker binary {self._binary} closed its ready pipe "
                        "without starting and did not exit; killed"
                    )
                self._died("at start")
            got += chunk

    def _close_told(self) -> None:
        if self._told is not None:
            self._told.close()

    def _gave_up(self, message: str) -> None:
        """The binary did not start in time: kill and reap it, and raise."""
        assert self._proc is not None
        _kill_and_reap(self._proc, 1.0)
        err = self._ended()
        raise TrackerError(message + (f": {err}" if err else ""))

    def _ended(self) -> str:
        """The binary is reaped: its end recorded, its stderr file closed; the tail of
        what it said there."""
        assert self._proc is not None
        self._close_told()
        self._exit_code = self._proc.returncode
        self.stop_time = time.time()
        self._stderr.close()
        _live.discard(self)
        return self._read_stderr()

    def _read_stderr(self) -> str:
        try:
            txt = self._path("stderr.log").read_text(errors="replace")
        except OSError:
            return ""
        lines = [l for l in txt.splitlines() if l.strip()]
        return "\n".join(lines[-8:])

    def _died(self, when: str) -> None:
        """The binary exited without being asked to: reap it and raise."""
        assert self._proc is not None
        code = self._proc.wait()
        err = self._ended()
        self._read_new()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise TrackerDiedError(
            f"the resource-tracker binary {how} {when}"
            + (f": {err}" if err else "")
            + f" ({len(self._samples)} sample(s) kept)"
        )

    def _check_alive(self) -> None:
        if self._proc is not None and self.stop_time is None and self._proc.poll() is not None:
            self._died("while tracking")

    def stop(self) -> "ResourceTracker":
        """Stop the binary: it writes a final sample for the partial interval and the
        summary. Calling it again is harmless."""
        if self._from_snapshot:
            return self
        if self._proc is None:
            raise TrackerError("stop() called before start()")
        if self.stop_time is not None:
            return self
        if self._owner != os.getpid():
            raise TrackerError("stop() in a forked child: only the process that started the tracker can stop it")
        if self._proc.poll() is not None:
            self._died("before stop()")
        # Read before the binary's last reading, which stop() waits for.
        _tell(self._told)
        self._close_told()
        self._proc.send_signal(signal.SIGTERM)
        try:
            code = self._proc.wait(timeout=self.stop_timeout + self.interval)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            self.stop_time = time.time()
            self._stderr.close()
            _live.discard(self)
            raise TrackerError(
                f"the resource-tracker binary did not stop within {self.stop_timeout + self.interval:.1f} s "
                "of SIGTERM and was killed"
            )
        self.stop_time = time.time()
        self._exit_code = code
        _live.discard(self)
        self._stderr.close()
        self._read_new()
        if code != 0:
            err = self._read_stderr()
            raise TrackerDiedError(
                f"the resource-tracker binary exited with code {code} when stopped"
                + (f": {err}" if err else "")
            )
        self._load_summary()
        self._load_events()
        return self

    def _load_summary(self) -> None:
        p = self._path("summary.json")
        try:
            self._summary = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise TrackerError(f"the binary's summary {p} could not be read: {e}") from e
        global _said_procfs
        if self._summary.get("backend") == "procfs" and not _said_procfs:
            import logging

            _said_procfs = True
            logging.getLogger("resource_tracker_ebpf").warning(
                "resource-tracker: procfs backend (%s): short-lived processes may be missed",
                self._summary.get("backend_reason") or "eBPF not available",
            )

    def _load_events(self) -> None:
        p = self._path("events.jsonl")
        ev: List[Dict[str, Any]] = []
        try:
            with open(p) as f:
                for line in f:
                    if line.endswith("\n"):
                        ev.append(json.loads(line))
        except FileNotFoundError:
            pass
        self._events = ev

    def __enter__(self) -> "ResourceTracker":
        if not self.running:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.running:
            self.stop()
        return False

    def cleanup(self) -> None:
        """Stop the binary if needed and remove the temporary files now."""
        try:
            if self.running:
                self.stop()
        finally:
            fin = getattr(self, "_finalizer", None)
            if fin is not None:
                fin()

    # --- reading ------------------------------------------------------------------

    def _read_new(self) -> None:
        """Parse the samples the binary appended since the last read; a line still
        being written (no newline yet) waits for the next read."""
        if self._tmpdir is None or self._from_snapshot:
            return
        try:
            with open(self._path("samples.jsonl"), "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        for line in chunk[: end + 1].splitlines():
            if line.strip():
                self._samples.append(json.loads(line))
        self._offset += end + 1

    @property
    def running(self) -> bool:
        return self._proc is not None and self.stop_time is None

    @property
    def samples(self) -> List[Dict[str, Any]]:
        """Every sample as the binary wrote it (docs/schema.md): per-disk, per-GPU,
        per-interface figures, the tree and the tracker's own cost."""
        self._check_alive()
        self._read_new()
        return self._samples

    @property
    def n_samples(self) -> int:
        return len(self.samples)

    def wait_for_samples(self, n: int = 1, timeout: float = 5) -> None:
        """Block until `n` samples are in, the binary dies, or `timeout` seconds pass
        (each a clear exception)."""
        if self.running:
            deadline = time.monotonic() + timeout
            while self.n_samples < n:
                if time.monotonic() > deadline:
                    raise TrackerError(f"timed out after {timeout} s waiting for {n} sample(s)")
                time.sleep(min(self.interval / 10, 0.05))
        elif self.n_samples < n:
            raise TrackerError(
                f"the tracker is not running and has {self.n_samples} sample(s), fewer than {n}"
            )

    @property
    def summary(self) -> Optional[Dict[str, Any]]:
        """The binary's run summary (docs/schema.md), once stopped."""
        return self._summary

    @property
    def events(self) -> List[Dict[str, Any]]:
        """Every fork, exec and exit of the tree (eBPF), once stopped."""
        return list(self._events or [])

    @property
    def backend(self) -> Optional[str]:
        """`ebpf` or `procfs`."""
        if self._summary:
            return self._summary.get("backend")
        for s in self.samples:
            if s.get("process"):
                return s["process"].get("backend")
        return None

    @property
    def memory_source(self) -> Optional[str]:
        """What the memory figures are: `cgroup` (the charge of a cgroup holding
        exactly the tree), `pss` (Σ PSS; always so with a pid, as here) or `rss`.
        Runs of different sources must not be combined (recommend_resources'
        historical_stats)."""
        if self._summary and self._summary.get("memory_source"):
            return self._summary["memory_source"]
        rows = [s["process"] for s in self.samples if s.get("process")]
        return C.memory_source(rows[-1]) if rows else None

    @property
    def exit_code(self) -> Optional[int]:
        return self._exit_code

    @property
    def server_info(self) -> Optional[Dict[str, Any]]:
        """The host as the binary read it at start (`summary["host"]`: vCPUs, CPU
        model, memory, GPUs, storage) with the run's allocation verdict, once
        stopped."""
        if not self._summary:
            return None
        host = self._summary.get("host") or {}
        gpus = host.get("host_gpu_count") or 0
        model = host.get("host_gpu_model")
        # 0.5.0's keys first, then the binary's.
        info: Dict[str, Any] = {
            "os": "Linux",
            "vcpus": host.get("host_vcpus"),
            "memory_mib": host.get("host_memory_mib"),
            "gpu_count": gpus,
            "gpu_names": [model] * gpus if model else [],
            "gpu_name": model or "",
            "gpu_memory_mib": host.get("host_gpu_memory_mib") or 0,
        }
        info.update(host)
        info["allocation"] = (self._summary.get("recommendation") or {}).get("allocation")
        return info

    @property
    def cloud_info(self) -> Optional[Dict[str, Any]]:
        """What the cloud's metadata service said (`summary["cloud"]`; probed only with
        discover_cloud=True), once stopped: 0.5.0's `vendor`, `instance_type` and
        `region` ("unknown" where not found or not probed), then the binary's fields."""
        if self._summary is None:
            return None
        cloud = self._summary.get("cloud") or {}
        info: Dict[str, Any] = {
            "vendor": cloud.get("cloud_vendor_id") or "unknown",
            "instance_type": cloud.get("cloud_instance_type") or "unknown",
            "region": cloud.get("cloud_region_id") or "unknown",
        }
        info.update(cloud)
        return info

    @property
    def process_metrics(self) -> Any:
        """The tree, one row per sample: the Python package's columns (timestamp, pid,
        children, utime, stime, cpu_usage, memory_mib, disk_read_bytes,
        disk_write_bytes, gpu_usage, gpu_vram_mib, gpu_utilized), then every other
        field of the binary's `process` (backend, cpu_secs_total, cpu_source, …), in
        its JSON's order. A pandas DataFrame when pandas is installed, else a list of
        dicts."""
        samples = self.samples
        rows = [r for r in (C.process_row(s) for s in samples) if r is not None]
        return C.table(rows, C.PROCESS_COLUMNS + C.process_extra(samples))

    @property
    def system_metrics(self) -> Any:
        """The host, one row per sample, the Python package's columns then ours."""
        return C.table([C.system_row(s) for s in self.samples], C.SYSTEM_COLUMNS + C.SYSTEM_EXTRA)

    @property
    def tracker_metrics(self) -> Any:
        """The observer's own cost per sample: CPU seconds, RSS, lost events."""
        return C.table([C.tracker_row(s) for s in self.samples], C.TRACKER_COLUMNS)

    def get_combined_metrics(
        self,
        bytes: bool = False,
        human_names: bool = False,
        system_prefix: Optional[str] = None,
        process_prefix: Optional[str] = None,
        offset: Optional[int] = None,
    ) -> Any:
        """System and process rows side by side (`system_…`, `process_…`), the Python
        package's 32 columns first, in its order. `bytes` converts MiB and GB columns to
        bytes (the names stay, as 0.5.0's); `human_names` gives 0.5.0's readable names
        ("System CPU time (user)", "Process memory usage"; ours keep theirs) and the
        prefixes "System " and "Process "."""
        sp = system_prefix if system_prefix is not None else ("System " if human_names else "system_")
        pp = process_prefix if process_prefix is not None else ("Process " if human_names else "process_")

        def name(c: str) -> str:
            return C.HUMAN_NAMES.get(c, c) if human_names else c

        rows = []
        samples = self.samples[offset or 0 :]
        extra = C.process_extra(samples)
        sys_cols = C.SYSTEM_COLUMNS[1:] + C.SYSTEM_EXTRA
        proc_cols = C.PROCESS_COLUMNS[1:] + extra
        ts = name("timestamp")
        names: List[str] = [ts]
        names += [sp + name(c) for c in C.SYSTEM_COLUMNS[1:]]
        names += [pp + name(c) for c in C.PROCESS_COLUMNS[1:]]
        names += [sp + name(c) for c in C.SYSTEM_EXTRA] + [pp + name(c) for c in extra]
        for s in samples:
            p = C.process_row(s)
            if p is None and self.track_processes:
                continue
            sysr = C.system_row(s)
            row = {ts: sysr["timestamp"]}
            for c in sys_cols:
                row[sp + name(c)] = sysr[c]
            for c in proc_cols:
                row[pp + name(c)] = p.get(c) if p else None
            if bytes:
                # Each column once: gpu_vram_mib is both a system and a process one.
                for prefix, cols in ((sp, sys_cols), (pp, proc_cols)):
                    for c in cols:
                        f = 1048576 if c.endswith("_mib") else 1e9 if c.endswith("_gb") else None
                        v = row.get(prefix + name(c))
                        if f is not None and v is not None and not isinstance(v, bool):
                            row[prefix + name(c)] = v * f
            rows.append(row)
        return C.table(rows, names)

    # --- answers --------------------------------------------------------------------

    def stats(self, specs: Optional[Sequence[StatSpec]] = None) -> Dict[str, Dict[str, Any]]:
        """The Python package's stats(): mean and max of the tree's CPU (cores), memory
        (MiB), GPU usage, VRAM and GPUs in use; max disk space used (GB); Σ network
        bytes; duration. Once stopped these are the binary's summary `stats`; while
        running, the same rules over the samples so far.

        With `specs` (0.5.0's StatSpec list), those statistics of
        get_combined_metrics()'s columns instead; a "duration" of "timestamp" counts
        the first sample's interval too, as 0.5.0's."""
        if specs is not None:
            if self.n_samples == 0:
                raise TrackerError("no samples collected (yet)")
            out = self.get_combined_metrics().stats(specs)
            if "duration" in out.get("timestamp", {}):
                out["timestamp"]["duration"] += self.interval
            return out
        if self._summary is not None:
            st = self._summary.get("stats")
            if not st:
                raise TrackerError("no tracked tree in this run: no stats")
            return _stats_from_summary(st)
        rows = [r for r in (C.process_row(s) for s in self.samples) if r is not None]
        if not rows:
            raise TrackerError("no samples collected (yet)")
        sysrows = [C.system_row(s) for s in self.samples if s.get("process")]

        def mm(col: str) -> Dict[str, float]:
            vals = [r[col] for r in rows if r[col] is not None]
            if not vals:
                return {"mean": 0.0, "max": 0.0}
            return {"mean": _round2(sum(vals) / len(vals)), "max": _round2(max(vals))}

        first = self.samples[0]
        memory = mm("memory_mib")
        # The cgroup's own peak (memory_source "cgroup") sees between samples too.
        peaks = [r["memory_peak_mib"] for r in rows if r["memory_peak_mib"] is not None]
        if peaks:
            memory["max"] = _round2(max(memory["max"], max(peaks)))
        out = {
            "process_cpu_usage": mm("cpu_usage"),
            "process_memory_mib": memory,
            "process_gpu_usage": mm("gpu_usage"),
            "process_gpu_vram_mib": mm("gpu_vram_mib"),
            "process_gpu_utilized": mm("gpu_utilized"),
            "system_disk_space_used_gb": {
                "max": _round2(max(r["disk_space_used_gb"] for r in sysrows))
            },
            "system_net_recv_bytes": {"sum": sum(r["net_recv_bytes"] or 0 for r in sysrows)},
            "system_net_sent_bytes": {"sum": sum(r["net_sent_bytes"] or 0 for r in sysrows)},
            "timestamp": {
                "duration": _round2(
                    rows[-1]["timestamp"] - rows[0]["timestamp"] + (first.get("interval_secs") or 0)
                )
            },
        }
        out.update(working_set(rows) or {})
        return out

    def recommend_resources(self, historical_stats: Sequence[Dict[str, Any]] = ()) -> Dict[str, Any]:
        """{"cpu", "memory" (MiB), "gpu", "vram" (MiB)}, the Python package's keys,
        plus "allocation" and "metaflow" (`@resources(…)`). Without history this is
        the binary's own recommendation; with history, the same rules over the runs
        combined (mean of means, max of maxes). Pass only runs of the same
        `memory_source`: figures measured another way (Σ RSS counts a page shared
        by N processes N times) would decide the memory alone."""
        if self._summary is not None and not historical_stats:
            r = self._summary.get("recommendation")
            if not r:
                raise TrackerError("no tracked tree in this run: no recommendation")
            return {
                "cpu": r["cpu"],
                "memory": r["memory_mib"],
                "gpu": r["gpu"],
                "vram": r["vram_mib"],
                "allocation": r.get("allocation"),
                "metaflow": r.get("metaflow"),
                "basis": r.get("basis"),
            }
        if self.running:
            self.wait_for_samples(1, timeout=self.interval * 5)
        st = self.stats()
        if historical_stats:
            st = aggregate_stats([st, *historical_stats])
        rec: Dict[str, Any] = recommend_from_stats(st)
        rec["metaflow"] = metaflow_resources(rec)
        return rec

    def recommend_server(self, **filters: Any) -> Dict[str, Any]:
        """The cheapest cloud server that fits the recommendation, from Spare Cores
        Keeper, as the binary asked it at the end of the run (network: only with
        ResourceTracker(recommend_server=True)). Keeper's own filters are not passed
        on (the binary builds the query)."""
        if filters:
            raise TypeError(f"recommend_server() takes no filters here: {sorted(filters)}")
        if self._summary is None:
            raise TrackerError("recommend_server() needs a stopped tracker (the binary asks at its end)")
        adv = self._summary.get("recommended_server")
        if adv:
            if adv.get("error") and not adv.get("server"):
                raise TrackerError(f"no server recommendation: {adv['error']}")
            if not adv.get("server"):
                raise TrackerError(f"no server in Keeper's catalogue fits (query: {adv.get('query')})")
            return adv
        if not self._recommend_server:
            raise TrackerError(
                "no server recommendation in this run: create the tracker with "
                "recommend_server=True (it asks Spare Cores Keeper over the network at the end)"
            )
        raise TrackerError(
            "the binary's summary has no server recommendation: this resource-tracker "
            "binary does not support --recommend-server yet"
        )

    def report(
        self,
        integration: str = "standalone",
        historical_stats: Sequence[Any] = (),
        status_failed: bool = False,
        integration_version: Optional[str] = None,
        *,
        path: Optional[str] = None,
        history: Sequence["ResourceTracker"] = (),
        recommend_server: bool = False,
        timeout: float = 120.0,
    ) -> "Report":
        """The binary's self-contained HTML report of this run: charts, statistics,
        recommendations and, with eBPF, the process timeline. 0.5.0's arguments come
        first; the page says Pending while the tracker runs, Finished once stopped,
        and Failed with `status_failed=True`.

        `history` (or `historical_stats` given as trackers): earlier runs of the same
        job, for the statistics across runs. 0.5.0's stats dicts cannot be drawn (the
        page is made from samples) and are refused. The page is returned as a Report
        (a str with save() and browse()), and written to `path` when given."""
        if integration not in ("standalone", "Metaflow", "R"):
            raise ValueError(f"integration must be 'standalone', 'Metaflow' or 'R', not {integration!r}")
        earlier = list(history)
        for h in historical_stats:
            if not isinstance(h, ResourceTracker):
                raise TypeError(
                    "report(historical_stats=...): give earlier runs as trackers "
                    "(ResourceTracker.from_snapshot of their snapshots), not stats dicts: "
                    "the page is drawn from their samples"
                )
            earlier.append(h)
        if self.running:
            self.wait_for_samples(1, timeout=self.interval * 5)
        samples = self.samples
        if not samples:
            raise TrackerError("no samples to report on (yet)")
        import re

        binary = find_binary(self._binary_arg)
        work = _mkdtemp("resource-tracker-report-")
        try:
            help_text = run_once(binary, ["report", "--help"], timeout=30)
            # `--events FILE` when the report has that option; otherwise a run's
            # events and summary files follow its samples file on the command line.
            events_flag = re.search(r"^\s*(?:-\w,\s*)?--events[\s=<]", help_text, re.M) is not None
            args = ["report"]
            for i, t in enumerate([self, *earlier]):
                sp = Path(work) / f"run{i}.jsonl"
                t._write_samples(sp)
                args.append(str(sp))
                if t._events:
                    ep = Path(work) / f"run{i}-events.jsonl"
                    with open(ep, "w") as f:
                        for e in t._events:
                            f.write(json.dumps(e) + "\n")
                    args += ["--events", str(ep)] if events_flag else [str(ep)]
                if t._summary and not events_flag:
                    smp = Path(work) / f"run{i}-summary.json"
                    smp.write_text(json.dumps(t._summary))
                    args.append(str(smp))
            out = Path(work) / "report.html"
            args += ["-o", str(out)]
            if "--status" in help_text:
                status = "failed" if status_failed else "pending" if self.running else "finished"
                args += ["--status", status, "--title", f"resource-tracker report: {self._job_title()}"]
            if "--hints" in help_text:
                # The page's hints in this package's terms, not the CLI's flags.
                args += ["--hints", "python"]
            if recommend_server:
                args.append("--recommend-server")
            run_once(binary, args, timeout=timeout)
            page = Report(out.read_text())
        finally:
            _rmtree(work)
        if path is not None:
            page.save(path)
        return page

    def _job_title(self) -> str:
        """The job's name, else the script's, else the tracked pid's."""
        if self.job_name:
            return self.job_name
        import sys

        script = sys.argv[0] if sys.argv else ""
        if script and script not in ("-c", "-m", "-"):
            return os.path.basename(script)
        return f"pid {self.pid}"

    def _duration(self) -> Optional[float]:
        """Seconds tracked: the summary's `stats.duration_secs` (the samples'
        intervals added up, untouched by a wall-clock step), else, as 0.5.0
        counts it, from the start to the stop (or now) and one interval more."""
        st = (self._summary or {}).get("stats") or {}
        if isinstance(st.get("duration_secs"), (int, float)):
            return _round2(st["duration_secs"])
        if self.start_time is None:
            return None
        return _round2((self.stop_time or time.time()) - self.start_time + self.interval)

    def _write_samples(self, p: Path) -> None:
        with open(p, "w") as f:
            for s in self._samples:
                f.write(json.dumps(s) + "\n")

    # --- snapshots ------------------------------------------------------------------

    def snapshot(self) -> Dict[str, Any]:
        """Everything needed to rebuild this tracker's data elsewhere (a Metaflow
        artifact, a file): settings, samples, summary and events."""
        samples = self.samples
        return {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "package_version": __version__,
            "metadata": {
                "pid": self.pid,
                "interval": self.interval,
                "track_processes": self.track_processes,
                "start_time": self.start_time,
                "stop_time": self.stop_time,
                "exit_code": self._exit_code,
                "job_name": self.job_name,
                "tags": self.tags,
                "n_samples": len(samples),
                # 0.5.0's key: seconds tracked, the binary's monotonic figure
                # where its summary has one.
                "duration": self._duration(),
            },
            "samples": list(samples),
            "summary": self._summary,
            "events": self._events,
        }

    @classmethod
    def from_snapshot(cls, snap: Any) -> "ResourceTracker":
        if not isinstance(snap, dict) or snap.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotError(
                "not a resource-tracker-ebpf snapshot (a snapshot of the Python "
                "resource-tracker package or another object?)"
            )
        if snap.get("version") != SNAPSHOT_VERSION:
            raise SnapshotError(
                f"snapshot version {snap.get('version')!r} (package {snap.get('package_version')}) "
                f"is not the version {SNAPSHOT_VERSION} this package ({__version__}) reads"
            )
        try:
            md = snap["metadata"]
            samples = snap["samples"]
            if not isinstance(samples, list) or len(samples) != md["n_samples"]:
                raise SnapshotError(
                    f"truncated snapshot: {len(samples) if isinstance(samples, list) else 'no'} "
                    f"sample(s) of {md['n_samples']}"
                )
            t = cls(
                pid=md["pid"],
                interval=md["interval"],
                track_processes=md["track_processes"],
                job_name=md.get("job_name"),
                tags=md.get("tags"),
            )
            t.start_time = md["start_time"]
            t.stop_time = md["stop_time"]
            t._exit_code = md.get("exit_code")
            for s in samples:
                s["timestamp_secs"]  # every sample has its time: a cheap shape check
            t._samples = samples
            t._summary = snap["summary"]
            t._events = snap.get("events")
        except SnapshotError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise SnapshotError(f"malformed or truncated snapshot: missing or bad {e}") from e
        t._from_snapshot = True
        return t

    def dumps(self) -> str:
        return json.dumps(self.snapshot())

    @classmethod
    def loads(cls, s: str) -> "ResourceTracker":
        try:
            snap = json.loads(s)
        except ValueError as e:
            raise SnapshotError(f"not a snapshot (truncated or not JSON): {e}") from e
        return cls.from_snapshot(snap)

    def dump(self, file: str) -> None:
        """The snapshot as gzipped JSON."""
        import gzip

        with gzip.open(file, "wt") as f:
            f.write(self.dumps())

    @classmethod
    def load(cls, file: str) -> "ResourceTracker":
        import gzip

        try:
            with gzip.open(file, "rt") as f:
                text = f.read()
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise SnapshotError(f"{file}: not a complete gzipped snapshot: {e}") from e
        return cls.loads(text)

    def __repr__(self) -> str:
        state = "running" if self.running else ("stopped" if self.stop_time else "not started")
        return f"<ResourceTracker pid={self.pid} interval={self.interval} {state} samples={len(self._samples)}>"


def run_command(
    command: Sequence[str],
    *,
    cpus: Optional[float] = None,
    memory: Optional[Any] = None,
    interval: float = 1,
    ebpf: Optional[bool] = None,
    job_name: Optional[str] = None,
    tags: Optional[Dict[str, str]] = None,
    binary: Optional[str] = None,
    extra_args: Sequence[str] = (),
) -> ResourceTracker:
    """Run `command` under the binary's `run`, optionally with a CPU quota and a
    memory limit (`cpus`: a number of CPUs; `memory`: MiB as a number, or a size
    such as "512M" or "2G"), so that a recommendation can be tried on the job before
    it is shipped. Returns once the command has ended: a stopped tracker whose
    samples, summary (`summary["limits"]`: OOM kills, throttling), stats() and
    recommend_resources() are the run's; `exit_code` is the command's (137 when the
    memory limit's OOM killer ended it). Limits that cannot be put in place raise
    TrackerError with the binary's one line: the command is never run without them."""
    cmd = [str(c) for c in command]
    if not cmd:
        raise ValueError("command must name a program to run")
    if not (isinstance(interval, (int, float)) and interval >= 0.1):
        raise ValueError(f"interval must be a number of seconds >= 0.1, not {interval!r}")
    exe = find_binary(binary)
    tmpdir = _mkdtemp("resource-tracker-py-")
    samples, summary = Path(tmpdir) / "samples.jsonl", Path(tmpdir) / "summary.json"
    args = [str(exe), "run", "-i", repr(float(interval)), "-f", "json", "-q"]
    args += ["-o", str(samples), "--summary", str(summary)]
    if cpus is not None:
        args += ["--cpus", str(cpus)]
    if memory is not None:
        args += ["--memory", f"{memory}M" if isinstance(memory, (int, float)) else str(memory)]
    if ebpf is False:
        args.append("--no-ebpf")
    if job_name:
        args += ["--job-name", job_name]
    for k, v in (tags or {}).items():
        args += ["--tag", f"{k}={v}"]
    args += list(extra_args)
    try:
        start = time.time()
        try:
            proc = subprocess.run(args + ["--", *cmd], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as e:
            raise TrackerError(f"cannot execute {exe}: {e}") from e
        err = proc.stderr.decode(errors="replace").strip()
        if not summary.exists():
            raise TrackerError(f"the resource-tracker binary exited with code {proc.returncode}: {err}")
        t = ResourceTracker(pid=os.getpid(), interval=interval, job_name=job_name, tags=tags, binary=binary)
        t.start_time, t.stop_time, t._exit_code = start, time.time(), proc.returncode
        t._tmpdir = tmpdir
        t._read_new()
        t._load_summary()
        t._events = []
        t._tmpdir, t._from_snapshot = None, True
        return t
    finally:
        _rmtree(tmpdir)
