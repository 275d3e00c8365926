"use strict";
// Draws the report from the JSON in #report-data: cards, synchronised charts
// (uPlot) and the process timeline (canvas). Everything is inlined: no request
// is made when the page opens.
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    errors.push(String(e.message || e));
    document.body.dataset.errors = String(errors.length);
  });
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var root = document.getElementById("report");
  var tip = document.getElementById("tip");
  var PALETTE = ["#2f6fdb", "#e8710a", "#1e8e3e", "#d93025", "#9334e6", "#12b5cb",
    "#f9ab00", "#e52592", "#5f6368", "#188038", "#a142f4", "#b06000"];
  var OTHER = "#b8c0cc";

  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "cls") e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    (kids || []).forEach(function (c) { if (c) e.appendChild(c); });
    return e;
  }
  function num(x, d) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    return Number(x).toLocaleString("en-US", { maximumFractionDigits: d === undefined ? 2 : d });
  }
  function bytes(b) {
    if (b === null || b === undefined || !isFinite(b)) return "–";
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return num(b, i ? 1 : 0) + " " + u[i];
  }
  function secs(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    if (s < 1e-3) return num(s * 1e6, 0) + " µs";
    if (s < 1) return num(s * 1e3, 1) + " ms";
    if (s < 120) return num(s, 2) + " s";
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = Math.round(s % 60);
    return (h ? h + " h " : "") + m + " min " + r + " s";
  }
  function usd(x) { return x === null || x === undefined ? "–" : "$" + num(x, x < 1 ? 4 : 2); }
  function card(title, rows, extra) {
    var t = el("table", {}, rows.filter(Boolean).map(function (r) {
      return el("tr", {}, [el("td", { text: r[0] }), el("td", { text: r[1] })]);
    }));
    return el("div", { cls: "card" }, [el("h3", { text: title })].concat(extra || []).concat([t]));
  }
  function exitText(st) {
    if (st === null || st === undefined) return "still running";
    if ((st & 0x7f) === 0) return "exit " + ((st >> 8) & 0xff);
    return "killed by signal " + (st & 0x7f);
  }

  var first = D.runs[0] || {};
  // Made by the Python package: hints name its arguments, not the tracker's flags.
  var PY = D.hints === "python";
  var sum = first.summary || {};
  var host = sum.host || {};
  var cloud = sum.cloud || null;

  root.appendChild(el("h2", { text: "Server and run" }));
  var runRows = [
    ["runs", String(D.runs.length)],
    ["backend", first.backend || "–"],
    ["samples", num(D.runs.reduce(function (a, r) { return a + r.samples; }, 0), 0)],
    ["interval", first.interval_secs ? secs(first.interval_secs) : "–"],
    sum.exit_code !== undefined && sum.exit_code !== null ? ["exit code", String(sum.exit_code)] : null,
    first.stats ? ["duration", secs(first.stats.duration_secs)] : null
  ];
  var serverRows = [
    ["vCPUs", host.host_vcpus !== undefined ? num(host.host_vcpus, 0) : "–"],
    ["CPU", host.host_cpu_model || "–"],
    ["memory", host.host_memory_mib ? bytes(host.host_memory_mib * 1048576) : "–"],
    ["storage", host.host_storage_gb ? num(host.host_storage_gb, 0) + " GB" : "–"],
    ["GPUs", host.host_gpu_count ? host.host_gpu_count + " × " + (host.host_gpu_model || "GPU") : "none"],
    first.recommendation ? ["allocation", first.recommendation.allocation] : null
  ];
  var cloudRows = cloud ? [
    ["vendor", cloud.cloud_vendor_id || "–"], ["region", cloud.cloud_region_id || "–"],
    ["instance type", cloud.cloud_instance_type || "–"],
    D.server && D.server.current_price_usd_per_hour !== null && D.server.current_price_usd_per_hour !== undefined
      ? ["cost of this run", usd(D.server.current_run_cost_usd)] : null
  ] : [["cloud", PY ? "not discovered (ResourceTracker(discover_cloud=True))" : "not discovered (run with --discover)"]];
  root.appendChild(el("div", { cls: "cards" }, [
    card("Run", runRows), card("Server", serverRows), card("Cloud", cloudRows)
  ]));

  // Statistics and recommendations: one run's, or several runs' combined.
  var st = D.combined ? D.combined.stats : first.stats;
  var rec = D.combined ? D.combined.recommendation : first.recommendation;
  function mm(m, f) { return m ? f(m.mean) + " mean, " + f(m.max) + " max" : "–"; }
  root.appendChild(el("h2", { text: D.combined ? "Usage and recommendation over " + D.combined.runs + " runs" : "Usage and recommendation" }));
  var cards = [];
  if (st) {
    cards.push(card("Usage of the process tree", [
      ["CPU (cores)", mm(st.process_cpu_usage, function (x) { return num(x); })],
      ["memory", mm(st.process_memory_mib, function (x) { return num(x, 1) + " MiB"; })],
      st.process_gpu_usage ? ["GPU usage", mm(st.process_gpu_usage, num)] : null,
      st.process_gpu_vram_mib ? ["VRAM", mm(st.process_gpu_vram_mib, function (x) { return num(x, 0) + " MiB"; })] : null,
      st.process_gpu_utilized ? ["GPUs in use", mm(st.process_gpu_utilized, num)] : null,
      ["duration", secs(st.duration_secs)]
    ]));
    // Disk space and network are the host's (no per-tree figure exists for them).
    cards.push(card("The host during the run", [
      ["disk space used", st.system_disk_space_used_gb !== null ? num(st.system_disk_space_used_gb) + " GB max" : "–"],
      ["network received", bytes(st.system_net_recv_bytes)],
      ["network sent", bytes(st.system_net_sent_bytes)]
    ]));
  }
  if (rec) {
    var big = el("div", { cls: "big", text: rec.cpu + " CPU · " + bytes(rec.memory_mib * 1048576) + (rec.gpu ? " · " + rec.gpu + " GPU" : "") });
    cards.push(card("Recommended resources", [
      ["CPU", String(rec.cpu)],
      ["memory", rec.memory_mib + " MiB (peak " + (rec.memory_basis || rec.memory_source).replace("_", " ") + " × 1.2)"],
      rec.page_cache_reread_mib >= 1 ? ["page cache read back", num(rec.page_cache_reread_mib, 0) + " MiB beyond the working set, in the advice (" + rec.memory_without_reread_mib + " MiB runs it reading from storage)"] : null,
      rec.page_cache_peak_mib >= 1 ? ["page cache", "up to " + num(rec.page_cache_peak_mib, 0) + " MiB; the rest is left out: a limit reclaims it"] : null,
      rec.cpu_slowdown > 1 ? ["at " + rec.cpu + " CPU", num(rec.cpu_slowdown) + "× the measured time; " + rec.cpu_within_5pct + " CPU within 5 %"] : null,
      ["GPU", String(rec.gpu)],
      ["VRAM", rec.vram_mib ? rec.vram_mib + " MiB" : "–"],
      ["server was", rec.allocation],
      !D.combined && sum.pressure ? ["stalled", "cpu " + secs(sum.pressure.cpu_secs) + ", memory " + secs(sum.pressure.memory_secs) + ", io " + secs(sum.pressure.io_secs) + (sum.pressure.memory_secs > 0.01 * (sum.wall_secs || Infinity) ? ": it stalled on memory, so the memory advice is low" : "")] : null,
      !D.combined && sum.limits ? ["ran under", (sum.limits.cpus ? sum.limits.cpus + " CPU" : "no CPU limit") + ", " + (sum.limits.memory_mib ? num(sum.limits.memory_mib, 0) + " MiB" : "no memory limit") + (sum.limits.oom_kills ? ", " + sum.limits.oom_kills + " OOM kill(s)" : "") + (sum.limits.throttled_secs ? ", throttled " + secs(sum.limits.throttled_secs) : "")] : null
    ], [big, el("p", {}, [el("code", { text: rec.metaflow })]), rec.basis ? el("p", { cls: "basis", text: rec.basis }) : null]));
  }
  if (D.server) {
    var s = D.server.server;
    if (s) {
      cards.push(card("Cheapest fitting server (Spare Cores Keeper)", [
        ["server", s.vendor_id + " " + s.name],
        ["vCPUs", num(s.vcpus, 0)],
        ["memory", num(s.memory_gib, 1) + " GiB"],
        s.gpu_count ? ["GPUs", num(s.gpu_count, 0) + (s.gpu_memory_gib ? " (" + num(s.gpu_memory_gib, 0) + " GiB)" : "")] : null,
        ["on-demand price", usd(s.price_usd_per_hour) + "/h"],
        ["this run on it", usd(D.server.run_cost_usd)],
        D.server.savings_pct !== null && D.server.savings_pct !== undefined ? ["saving", num(D.server.savings_pct) + " %"] : null
      ]));
    } else {
      cards.push(card("Cheapest fitting server (Spare Cores Keeper)", [["not found", D.server.error || "–"]]));
    }
  }
  root.appendChild(el("div", { cls: "cards" }, cards));

  // The observer's own cost, the backend, and what could not be measured.
  root.appendChild(el("h2", { text: "The tracker itself" }));
  var costCards = D.runs.map(function (r) {
    var c = r.cost, pct = c.tree_cpu_secs > 0 ? 100 * c.tracker_cpu_secs / c.tree_cpu_secs : null;
    return card(D.runs.length > 1 ? r.name : "Observer cost", [
      ["backend", (r.backend || "–") + (r.summary && r.summary.backend_reason ? " (" + r.summary.backend_reason + ")" : "")],
      ["tracker CPU", secs(c.tracker_cpu_secs) + (pct !== null ? " (" + num(pct, 3) + " % of the tree's)" : "")],
      ["tree CPU", secs(c.tree_cpu_secs)],
      ["tracker peak RSS", num(c.tracker_max_rss_mib, 1) + " MiB"],
      ["lost events", num(c.lost_events, 0)],
      ["untracked tasks", num(c.untracked_tasks, 0)]
    ], c.degraded.length ? [el("div", { cls: "warn", text: "Not exact: " + c.degraded.join("; ") })] : []);
  });
  root.appendChild(el("div", { cls: "cards" }, costCards));
  (D.notes || []).forEach(function (n) { root.appendChild(el("div", { cls: "warn", text: n })); });

  var CHARTS = [
    { title: "CPU (cores)", cols: [["proc_cpu", "Process CPU usage"], ["sys_cpu", "System CPU usage"]], fmt: num },
    { title: "Memory (MiB)", cols: [["proc_mem", "Process memory usage"], ["sys_mem", "System used memory"]], fmt: function (x) { return num(x, 0); } },
    { title: "Disk I/O (per second)", cols: [["proc_read", "Process disk read"], ["proc_write", "Process disk write"], ["sys_read", "System disk read"], ["sys_write", "System disk write"]], fmt: bytes },
    { title: "Disk space used (GB)", cols: [["disk_used_gb", "System disk space used"]], fmt: num },
    { title: "Network (per second)", cols: [["net_recv", "System inbound network traffic"], ["net_sent", "System outbound network traffic"]], fmt: bytes },
    { title: "GPU usage (GPUs)", cols: [["proc_gpu", "Process GPU usage"], ["sys_gpu", "System GPU usage"]], fmt: num },
    { title: "GPUs in use", cols: [["proc_gpus", "Process GPUs in use"]], fmt: num },
    { title: "VRAM (MiB)", cols: [["proc_vram", "Process VRAM used"], ["sys_vram", "System VRAM used"]], fmt: function (x) { return num(x, 0); } },
    { title: "Live processes of the tree", cols: [["live_procs", "processes"]], fmt: function (x) { return num(x, 0); } },
    { title: "Tracker's own CPU (cores)", cols: [["tracker_cpu", "tracker"]], fmt: function (x) { return num(x, 4); } }
  ];
  var COLORS = ["#2f6fdb", "#e8710a", "#1e8e3e", "#d93025"];
  var drawn = 0;

  D.runs.forEach(function (r, ri) {
    var head = el("h2", { text: (D.runs.length > 1 ? "Run " + (ri + 1) + ": " : "") + r.name });
    root.appendChild(head);
    var info = r.source + " · " + num(r.samples, 0) + " samples" +
      (r.samples_per_point > 1 ? " (" + r.samples_per_point + " per point on the charts; statistics use all)" : "") +
      " · from " + new Date(r.start_secs * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" +
      (r.hosts.length ? " · host " + r.hosts.join(", ") : "");
    root.appendChild(el("div", { cls: "sub", text: info }));
    if (r.skipped > 0) {
      var why = r.skips.map(function (s) { return "line " + s.line + ": " + s.why; }).join("\n");
      root.appendChild(el("div", { cls: "warn", text: r.skipped + " line(s) skipped:\n" + why }));
    }
    var series = {};
    r.series.forEach(function (p) { series[p[0]] = p[1]; });
    var grid = el("div", { cls: "charts" });
    root.appendChild(grid);
    var sync = uPlot.sync("run" + ri);
    // One time range for the charts and the timeline, from the run's start.
    var T = r.timeline;
    var lo = Math.min(0, T && T.bars ? T.bars.reduce(function (a, b) { return Math.min(a, b.start); }, 0) : (T && T.activity_start) || 0);
    var hi = Math.max(r.t.length ? r.t[r.t.length - 1] : 0, T ? T.span_secs : 0, lo + 1e-3);
    r.range = [lo, hi];
    var width = Math.max(480, Math.min(680, (root.clientWidth || 1200) / 2 - 30));
    CHARTS.forEach(function (c) {
      var cols = c.cols.filter(function (k) { return series[k[0]]; });
      if (!cols.length) return;
      var box = el("div", { cls: "chart", "data-chart": c.title });
      grid.appendChild(box);
      var data = [r.t].concat(cols.map(function (k) { return series[k[0]]; }));
      var opts = {
        title: c.title, width: width, height: 220,
        cursor: { sync: { key: sync.key } },
        scales: { x: { time: false, range: function () { return r.range; } } },
        series: [{ label: "s", value: function (u, v) { return v === null ? "–" : num(v, 1) + " s"; } }].concat(cols.map(function (k, i) {
          return { label: k[1], stroke: COLORS[i % COLORS.length], width: 1.5, value: function (u, v) { return v === null ? "–" : c.fmt(v); } };
        })),
        axes: [{ label: "seconds since start" }, { size: 84, values: function (u, vals) { return vals.map(function (v) { return c.fmt(v); }); } }]
      };
      new uPlot(opts, data, box);
      drawn++;
    });
    if (r.timeline) timeline(r, ri);
    else root.appendChild(el("div", { cls: "warn", text: PY
      ? "No process timeline: it is drawn from the eBPF backend's process events (run Python as root, or have an administrator grant the package's resource-tracker binary CAP_BPF and CAP_PERFMON: docs/deploy.md, \"A capability grant on the binary\")."
      : "No process timeline: it is drawn from the eBPF backend's process events (run as root, or give the run's --events file to `report`)." }));
  });
  document.body.dataset.charts = String(drawn);

  function timeline(r, ri) {
    var T = r.timeline;
    var box = el("div", { cls: "timeline", id: "timeline-" + ri });
    var mode = T.bars ? (T.bars.length <= 40 ? "process" : "command") : "activity";
    var title = "Process timeline: " + num(T.processes, 0) + " processes" +
      (T.still_running ? ", " + T.still_running + " still running at the end" : "") +
      (mode === "command" ? " (one row per command)" : mode === "activity" ? " (live processes per command over time)" : "");
    root.appendChild(el("h2", { text: title }));
    root.appendChild(box);
    var canvas = el("canvas");
    box.appendChild(canvas);
    var cmds = T.commands;
    // Collapsed by command: each command's processes packed into lanes (as many as
    // ran at once, at most MAX_LANES), so concurrency stays visible.
    var MAX_LANES = 12, laneOf = [], base = [], rows;
    if (mode === "command") {
      var ends = cmds.map(function () { return []; });
      var order = T.bars.map(function (b, i) { return i; });
      order.sort(function (a, b) { return T.bars[a].start - T.bars[b].start; });
      order.forEach(function (i) {
        var b = T.bars[i], lanes = ends[b.cmd], l = 0;
        while (l < lanes.length && lanes[l] > b.start) l++;
        if (l >= MAX_LANES) l = MAX_LANES - 1;
        lanes[l] = Math.max(lanes[l] || 0, b.end);
        laneOf[i] = l;
      });
      rows = 0;
      ends.forEach(function (lanes, ci) { base[ci] = rows; rows += Math.max(1, lanes.length); });
    } else {
      rows = mode === "process" ? T.bars.length : cmds.length;
    }
    var rowH = mode === "process" ? Math.max(3, Math.min(14, Math.floor(900 / Math.max(1, rows))))
      : mode === "command" ? Math.max(4, Math.min(12, Math.floor(900 / Math.max(1, rows)))) : 16;
    var labelW = mode === "process" ? 0 : 140;
    var W = Math.max(600, (box.clientWidth || 1200) - 20), H = rows * rowH + 24;
    var dpr = window.devicePixelRatio || 1;
    canvas.width = W * dpr; canvas.height = H * dpr;
    canvas.style.height = H + "px";
    var g = canvas.getContext("2d");
    g.scale(dpr, dpr);
    var t0 = r.range[0], t1 = r.range[1];
    var X = function (t) { return labelW + (t - t0) / (t1 - t0) * (W - labelW - 4); };
    function colour(ci) { return ci < PALETTE.length - 1 ? PALETTE[ci] : OTHER; }
    // Time axis.
    g.fillStyle = "#5f6b7a"; g.font = "11px system-ui, sans-serif";
    for (var k = 0; k <= 8; k++) {
      var tt = t0 + (t1 - t0) * k / 8, x = X(tt);
      g.fillRect(x, rows * rowH + 2, 1, 4);
      g.fillText(num(tt, 1) + " s", Math.min(x, W - 40), rows * rowH + 18);
    }
    var nBars = 0, hits = [];
    if (mode === "activity") {
      var w = T.bucket_secs, a0 = T.activity_start || 0;
      T.activity.forEach(function (counts, ci) {
        var peak = Math.max.apply(null, counts) || 1;
        g.fillStyle = "#1d232b"; g.fillText(cmds[ci].comm.slice(0, 18), 2, ci * rowH + 12);
        counts.forEach(function (n, b) {
          if (!n) return;
          g.globalAlpha = 0.25 + 0.75 * n / peak;
          g.fillStyle = colour(ci);
          var x0 = X(a0 + b * w), x1 = X(a0 + (b + 1) * w);
          g.fillRect(x0, ci * rowH + 2, Math.max(1, x1 - x0), rowH - 4);
          nBars++;
        });
        g.globalAlpha = 1;
      });
    } else {
      if (mode === "command") {
        g.fillStyle = "#1d232b";
        cmds.forEach(function (c, ci) { g.fillText(c.comm.slice(0, 18), 2, base[ci] * rowH + Math.min(11, rowH + 2)); });
      }
      T.bars.forEach(function (b, i) {
        var row = mode === "process" ? i : base[b.cmd] + laneOf[i];
        var x0 = X(b.start), x1 = Math.max(x0 + 1, X(b.end));
        g.fillStyle = colour(b.cmd);
        g.fillRect(x0, row * rowH + 1, x1 - x0, Math.max(1, rowH - 2));
        hits.push([x0, x1, row, i]);
        nBars++;
      });
      g.globalAlpha = 1;
    }
    canvas.dataset.mode = mode;
    canvas.dataset.bars = String(nBars);
    canvas.dataset.rows = String(rows);
    canvas.addEventListener("mousemove", function (ev) {
      var rect = canvas.getBoundingClientRect();
      var x = ev.clientX - rect.left, row = Math.floor((ev.clientY - rect.top) / rowH);
      var text = null;
      if (mode === "activity") {
        if (row >= 0 && row < cmds.length) {
          var b = Math.floor(((t0 + (x - labelW) / (W - labelW - 4) * (t1 - t0)) - (T.activity_start || 0)) / T.bucket_secs);
          var n = (T.activity[row] || [])[b];
          var c = cmds[row];
          text = c.comm + ": " + num(c.processes, 0) + " processes, " + secs(c.cpu_secs) + " CPU" + (n !== undefined ? "\n" + n + " alive in this slice" : "");
        }
      } else {
        for (var i = hits.length - 1; i >= 0; i--) {
          var h = hits[i];
          if (h[2] === row && x >= h[0] - 1 && x <= h[1] + 1) {
            var bb = T.bars[h[3]];
            text = cmds[bb.cmd].comm + " (pid " + bb.pid + ", parent " + bb.ppid + ")\n" +
              num(bb.start, 3) + " s → " + num(bb.end, 3) + " s (" + secs(bb.end - bb.start) + ")\nCPU " + secs(bb.cpu) + " · " + exitText(bb.exit);
            break;
          }
        }
      }
      if (text) {
        tip.textContent = text; tip.style.display = "block";
        tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
      } else tip.style.display = "none";
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    var legend = el("div", { cls: "legend" }, cmds.slice(0, PALETTE.length).map(function (c, ci) {
      var i = el("i"); i.style.background = colour(ci);
      return el("span", {}, [i, document.createTextNode(c.comm + " ×" + c.processes + " (" + secs(c.cpu_secs) + " CPU)")]);
    }));
    box.appendChild(legend);
  }

  document.body.dataset.renderMs = String(Math.round(performance.now()));
  document.body.dataset.rendered = "1";
})();
