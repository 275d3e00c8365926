"""The `tracked_resources_ebpf` card of @track_resources: recommendation as
`@resources(...)`, statistics, history of up to five earlier successful runs, small
inline charts, and the binary's own HTML report embedded. Self-contained: nothing is
fetched when the card is opened."""

from __future__ import annotations

import html
from typing import Any, Dict, List, Optional, Sequence, Tuple

from metaflow.cards import MetaflowCard

CSS = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.4em}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
code.rec{font-size:1.15em;background:#eef6ee;padding:4px 8px;border-radius:4px;display:inline-block}
.failed{color:#b00;font-weight:bold}.note{color:#666}
svg{background:#fafafa;border:1px solid #ddd}
iframe{width:100%;height:1600px;border:1px solid #ddd}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(v: Any, nd: int = 2) -> str:
    """A figure for the page, escaped: an artifact may hold anything there."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return _e(v)


def _chart(
    title: str, unit: str, t_start: float, series: Sequence[Tuple[str, str, List[Tuple[float, Optional[float]]]]]
) -> str:
    """A small SVG step chart from `t_start`: (label, colour, [(t, v)]) per series,
    each value held over the interval that ends at its sample."""
    w, h, pad = 640, 160, 36
    pts = [p for _, _, s in series for p in s if p[1] is not None]
    if len(pts) < 1:
        return ""
    t0 = t_start
    t1 = max(p[0] for p in pts)
    vmax = max(max(p[1] for p in pts), 1e-9)
    span = max(t1 - t0, 1e-9)

    def xy(t: float, v: float) -> str:
        return f"{pad + (t - t0) / span * (w - 2 * pad):.1f},{h - pad - v / vmax * (h - 2 * pad):.1f}"

    out = [f'<svg width="{w}" height="{h}" role="img" aria-label="{_e(title)}">']
    # The title's maximum is the first series' (the tree's); the axis holds them all.
    first = [p[1] for p in series[0][2] if p[1] is not None] if series else []
    top = f", {_e(series[0][0])} max {max(first):.2f}" if first else ""
    out.append(f'<text x="{pad}" y="16" font-size="13">{_e(title)} ({_e(unit)}){top}</text>')
    out.append(f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#999"/>')
    for i, (label, colour, s) in enumerate(series):
        steps: List[str] = []
        prev = t0
        for t, v in s:
            if v is not None:
                steps += [xy(prev, v), xy(t, v)]
            prev = t
        if steps:
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(steps)}"/>')
        out.append(f'<text x="{pad + 150 * i}" y="{h - 8}" font-size="12" fill="{colour}">{_e(label)}</text>')
    out.append(f'<text x="{w - pad}" y="{h - 8}" font-size="12" text-anchor="end">{span:.1f} s</text>')
    out.append("</svg>")
    return "".join(out)


def _stats_rows(st: Dict[str, Dict[str, Any]]) -> str:
    rows = [
        ("CPU (cores)", st["process_cpu_usage"]),
        ("memory (MiB)", st["process_memory_mib"]),
        ("GPU usage (GPUs)", st["process_gpu_usage"]),
        ("VRAM (MiB)", st["process_gpu_vram_mib"]),
        ("GPUs in use", st["process_gpu_utilized"]),
    ]
    out = "".join(
        f"<tr><td>{_e(n)}</td><td>{_fmt(v.get('mean'))}</td><td>{_fmt(v.get('max'))}</td></tr>" for n, v in rows
    )
    return (
        "<table><tr><th>process tree</th><th>mean</th><th>max</th></tr>"
        + out
        + "</table><table>"
        + f"<tr><td>duration (s)</td><td>{_fmt(st['timestamp']['duration'])}</td></tr>"
        + f"<tr><td>disk space used, max (GB)</td><td>{_fmt(st['system_disk_space_used_gb']['max'])}</td></tr>"
        + f"<tr><td>network received (bytes)</td><td>{_fmt(st['system_net_recv_bytes']['sum'])}</td></tr>"
        + f"<tr><td>network sent (bytes)</td><td>{_fmt(st['system_net_sent_bytes']['sum'])}</td></tr>"
        + "</table>"
    )


_SOURCES = {
    "cgroup": "the charge of a cgroup holding exactly the step's processes",
    "pss": "the sum of the processes' proportional set sizes (each shared page once)",
    "rss": "the sum of the processes' resident sizes (a shared page once per process)",
}


def _pressure(summary: Dict[str, Any]) -> str:
    """What the tree stalled on and the limits it ran under, as the summary says."""
    out = ""
    p = summary.get("pressure")
    if p:
        out += (
            f'<p id="pressure">Stalled: cpu {_fmt(p["cpu_secs"])} s, memory {_fmt(p["memory_secs"])} s, '
            f'io {_fmt(p["io_secs"])} s of {_fmt(summary.get("wall_secs"))} s.'
        )
        if p["memory_secs"] > 0.01 * (summary.get("wall_secs") or float("inf")):
            out += " The step stalled on memory: its memory figures, and the advice, are low."
        out += "</p>"
    lim = summary.get("limits")
    if lim and lim.get("escaped"):
        # Never a verdict for a step that did not run under them.
        out += (
            f'<p id="limits" class="failed">The limits ({_fmt(lim.get("cpus"))} CPU, {_fmt(lim.get("memory_mib"))} MiB) '
            f"did not hold for the whole step: {_e(lim['escaped'])}.</p>"
        )
    elif lim:
        out += (
            f'<p id="limits">Ran under {_fmt(lim.get("cpus"))} CPU, {_fmt(lim.get("memory_mib"))} MiB: '
            f'{_e(lim.get("oom_kills") or 0)} OOM kill(s), throttled {_fmt(lim.get("throttled_secs"))} s.</p>'
        )
    return out


def _memory_source(h: Dict[str, Any]) -> Optional[str]:
    """A history entry's memory source; entries stored before the field were
    measured as their recommendation says (PSS with pss=True, else RSS)."""
    return h.get("memory_source") or (h.get("recommendation") or {}).get("memory_source") or "rss"


class TrackedResourcesEbpfCard(MetaflowCard):
    """Rendered from the artifact @track_resources stores; not for direct use."""

    ALLOW_USER_COMPONENTS = False
    RUNTIME_UPDATABLE = False
    type = "tracked_resources_ebpf"

    def __init__(self, options: Optional[Dict[str, Any]] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._artifact_name = (options or {}).get("artifact_name", "resource_tracker_data")

    def render(self, task) -> str:
        try:
            data = getattr(task.data, self._artifact_name)
        except Exception as e:
            return self._page("Resource tracker", f"<p>No resource data artifact: {_e(e)}</p>")
        if data.get("error"):
            err = data["error"]
            body = (
                "<p>The resource tracker failed, so no data was collected.</p>"
                f"<p><b>{_e(err.get('error_type', ''))}</b>: {_e(err.get('error_message', ''))}</p>"
                f"<pre>{_e(err.get('traceback', ''))}</pre>"
            )
            return self._page("Resource tracker", body)
        return self._page(f"Resources of step {task.parent.id}", self._body(task, data))

    def _body(self, task, data: Dict[str, Any]) -> str:
        from resource_tracker_ebpf import ResourceTracker
        from resource_tracker_ebpf.columns import memory_mib

        t = ResourceTracker.from_snapshot(data["tracker"])
        history: List[Dict[str, Any]] = data.get("history") or []
        # Runs whose memory was measured another way (Σ RSS before memory_source,
        # say) are listed but never combined: their figures would decide alone.
        source = t.memory_source
        other = [h for h in history if _memory_source(h) != source]
        history = [h for h in history if _memory_source(h) == source]
        st = t.stats()
        rec = t.recommend_resources()
        parts: List[str] = []
        if data.get("step_failed"):
            parts.append('<p class="failed">The step failed; the figures cover it until it failed.</p>')
        summary = t.summary or {}
        parts.append(
            f"<p>Backend <b>{_e(t.backend)}</b>"
            + (f" ({_e(summary.get('backend_reason'))})" if summary.get("backend_reason") else "")
            + f", {len(t.samples)} samples every {t.interval:g} s, "
            + f"{_e(summary.get('processes_spawned', 0))} "
            # Polling sees only the processes alive at a sample.
            + (
                "processes seen at the samples (procfs misses those that start and end between two), "
                if t.backend == "procfs"
                else "processes started, "
            )
            + f"{_e(summary.get('lost_events', 0))} events lost; the tracker used "
            f"{_fmt(summary.get('tracker_cpu_secs'), 3)} s CPU and at most "
            f"{_fmt(summary.get('tracker_max_rss_mib'), 1)} MiB.</p>"
        )
        if data.get("limits"):
            # Started under them is all this says: whether the whole step stayed
            # under them is the summary's (below), never claimed here.
            parts.append(
                f'<p id="limit-flags">The step was started under <code>{_e(" ".join(data["limits"]))}</code> '
                "(its task in a cgroup of that CPU quota and memory limit); the task's log "
                "says whether it fit: OOM kills, time throttled.</p>"
            )
        parts.append("<h2>Recommendation</h2>")
        if history:
            combined = t.recommend_resources(historical_stats=[h["stats"] for h in history])
            parts.append(
                f'<p>From this run and {len(history)} earlier successful run(s):</p><code class="rec" id="recommendation">{_e(combined["metaflow"])}</code>'
                f'<p>This run alone: <code>{_e(rec["metaflow"])}</code>; server {_e(rec.get("allocation"))}.</p>'
            )
        else:
            parts.append(
                f'<code class="rec" id="recommendation">{_e(rec["metaflow"])}</code>'
                f"<p>The server was {_e(rec.get('allocation'))} (no earlier successful run to combine with).</p>"
            )
        if other:
            parts.append(
                f'<p class="note" id="memory-sources">{len(other)} earlier run(s) measured memory another way '
                f"({_e(', '.join(sorted({str(_memory_source(h)) for h in other})))}; this run: {_e(source)}) "
                "and are not combined with it.</p>"
            )
        if rec.get("basis"):
            parts.append(f'<p id="basis">{_e(rec["basis"])}.</p>')
        parts.append(_pressure(summary))
        parts.append(f"<p>Memory is <b>{_e(source)}</b>: {_e(_SOURCES.get(source or '', 'unknown'))}.</p>")
        parts.append("<h2>Statistics</h2>" + _stats_rows(st))
        if history:
            rows = "".join(
                f"<tr><td>{_e(h['run_id'])}</td><td>{_e(h['created_at'])}</td>"
                f"<td>{_fmt(h['stats']['timestamp']['duration'])}</td>"
                f"<td>{_fmt(h['stats']['process_cpu_usage']['mean'])}</td>"
                f"<td>{_fmt(h['stats']['process_memory_mib']['max'])}</td>"
                f"<td><code>{_e(h['recommendation'].get('metaflow'))}</code></td></tr>"
                for h in history
            )
            parts.append(
                f"<h2>History ({len(history)} earlier successful run(s))</h2>"
                '<table id="history"><tr><th>run</th><th>created</th><th>duration (s)</th>'
                "<th>CPU mean</th><th>memory max (MiB)</th><th>recommendation</th></tr>" + rows + "</table>"
            )
        proc = [s for s in t.samples if s.get("process")]
        t_start = proc[0]["timestamp_secs"] - (proc[0].get("interval_secs") or 0) if proc else 0.0
        parts.append("<h2>Over time</h2>")
        parts.append(
            _chart(
                "CPU",
                "cores",
                t_start,
                [
                    ("process tree", "#1f77b4", [(s["timestamp_secs"], s["cpu"].get("process_cores_used")) for s in proc]),
                    ("host", "#aaaaaa", [(s["timestamp_secs"], s["cpu"].get("utilization_pct")) for s in proc]),
                ],
            )
        )
        parts.append(
            _chart(
                "memory",
                "MiB",
                t_start,
                [
                    (
                        "process tree",
                        "#2ca02c",
                        [(s["timestamp_secs"], memory_mib(s["process"])) for s in proc],
                    )
                ],
            )
        )
        parts.append("<h2>Report</h2>" + self._report(t, history, bool(data.get("step_failed"))))
        from resource_tracker_ebpf import __version__

        # 0.5.0's card names its maker in these words.
        parts.append(
            f'<footer id="made-by">Generated by resource-tracker-ebpf {_e(__version__)} from '
            f"<code>Metaflow</code> using <code>{_e(t.backend)}</code>.</footer>"
        )
        return "".join(parts)

    def _report(self, t, history: List[Dict[str, Any]], failed: bool) -> str:
        """The binary's HTML report, embedded whole (its scripts run in the frame)."""
        earlier = []
        try:
            from metaflow import Task, get_namespace, namespace

            from resource_tracker_ebpf import ResourceTracker

            before = get_namespace()
            namespace(None)
            try:
                for h in history:
                    try:
                        d = getattr(Task(h["pathspec"]).data, self._artifact_name)
                        earlier.append(ResourceTracker.from_snapshot(d["tracker"]))
                    except Exception:  # the history table above still lists it
                        pass
            finally:
                namespace(before)
        except Exception:
            earlier = []
        try:
            page = t.report("Metaflow", status_failed=failed, history=earlier)
        except Exception as e:
            return f'<p class="note" id="report-missing">The report could not be made: {_e(e)}</p>'
        return f'<iframe id="report" title="resource-tracker report" sandbox="allow-scripts" srcdoc="{_e(page)}"></iframe>'

    @staticmethod
    def _page(title: str, body: str) -> str:
        return (
            '<!DOCTYPE html><html><head><meta charset="utf-8"><title>'
            + _e(title)
            + "</title><style>"
            + CSS
            + "</style></head><body><h1>"
            + _e(title)
            + "</h1>"
            + body
            + "</body></html>"
        )


CARDS = [TrackedResourcesEbpfCard]
