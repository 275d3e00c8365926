//! CSV rows from the sample model: the Python package's 32 "combined" columns first,
//! in its order and units (the Sentinel backend reads them), then the Rust
//! sibling's 33rd (`system_steal_time`), then ours.
//! Empty cells stand for null (no tree, no GPU, a source that could not be read).

use super::{
    fields::{self, Cell, TreeField},
    sample::{sum_present, ProcessSample, Sample, TREE_FIELDS},
};

pub const PYTHON_COLUMNS: [&str; 32] = [
    "timestamp",
    "system_processes",
    "system_utime",
    "system_stime",
    "system_cpu_usage",
    "system_memory_free_mib",
    "system_memory_used_mib",
    "system_memory_buffers_mib",
    "system_memory_cached_mib",
    "system_memory_active_mib",
    "system_memory_inactive_mib",
    "system_disk_read_bytes",
    "system_disk_write_bytes",
    "system_disk_space_total_gb",
    "system_disk_space_used_gb",
    "system_disk_space_free_gb",
    "system_net_recv_bytes",
    "system_net_sent_bytes",
    "system_gpu_usage",
    "system_gpu_vram_mib",
    "system_gpu_utilized",
    "process_pid",
    "process_children",
    "process_utime",
    "process_stime",
    "process_cpu_usage",
    "process_memory_mib",
    "process_disk_read_bytes",
    "process_disk_write_bytes",
    "process_gpu_usage",
    "process_gpu_vram_mib",
    "process_gpu_utilized",
];

/// The Rust sibling 0.1.18's column after the Python ones.
pub const SIBLING_COLUMNS: [&str; 1] = ["system_steal_time"];

/// Our columns after those (documented in docs/schema.md): these, the tree's
/// (`fields::csv_columns`, from the field registry), then `TRACKER_COLUMNS`.
pub const EXTRA_COLUMNS: [&str; 8] = [
    "interval_secs",
    "job_name",
    "system_memory_total_mib",
    "system_memory_available_mib",
    "system_swap_total_mib",
    "system_swap_used_mib",
    "system_memory_unavailable_mib",
    "system_cgroup_cpu_usage",
];

/// The tracker's own columns, last.
pub const TRACKER_COLUMNS: [&str; 4] = [
    "tracker_cpu_secs",
    "tracker_rss_mib",
    "tracker_lost_events",
    "tracker_degraded",
];

pub fn header() -> String {
    let mut h = PYTHON_COLUMNS.join(",");
    let tree = fields::csv_columns("process", TREE_FIELDS);
    let ours = SIBLING_COLUMNS
        .iter()
        .chain(&EXTRA_COLUMNS)
        .copied()
        .chain(tree.iter().map(String::as_str))
        .chain(TRACKER_COLUMNS);
    for c in ours {
        h.push(',');
        h.push_str(c);
    }
    h
}

/// A number with at most `dec` decimals, trailing zeros dropped.
fn num(x: f64, dec: usize) -> String {
    if !x.is_finite() {
        return String::new();
    }
    let mut s = format!("{x:.dec$}");
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    if s == "-0" {
        s = "0".into();
    }
    s
}

fn opt_num(x: Option<f64>, dec: usize) -> String {
    x.map(|v| num(v, dec)).unwrap_or_default()
}

fn opt_int<T: ToString>(x: Option<T>) -> String {
    x.map(|v| v.to_string()).unwrap_or_default()
}

/// RFC 4180 quoting, only where needed.
fn text(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One field of the tree as a cell.
fn cell(f: &TreeField<ProcessSample>, p: &ProcessSample) -> String {
    match (f.get)(p) {
        Cell::Null => String::new(),
        Cell::Num(v) => num(v, f.decimals()),
        Cell::Int(i) => i.to_string(),
        Cell::Text(t) => text(t),
        Cell::Flag(b) => b.to_string(),
    }
}

/// Bytes in the interval summed over the entries that have them; empty when none has.
fn interval_bytes(v: impl Iterator<Item = Option<u64>>) -> String {
    sum_present(v).map(|s| s.to_string()).unwrap_or_default()
}

pub fn row(s: &Sample) -> String {
    let mut cells: Vec<String> = Vec::with_capacity(64);
    let m = &s.memory;
    cells.push(num(s.timestamp_secs, 6));
    cells.push(opt_int(s.cpu.process_count));
    cells.push(opt_num(s.cpu.utime_secs, 6));
    cells.push(opt_num(s.cpu.stime_secs, 6));
    cells.push(opt_num(s.cpu.utilization_pct, 4));
    for v in [
        m.free_mib,
        m.used_mib,
        m.buffers_mib,
        m.cached_mib,
        m.active_mib,
        m.inactive_mib,
    ] {
        cells.push(opt_num(v, 4));
    }
    cells.push(interval_bytes(s.disk.iter().map(|d| d.read_bytes)));
    cells.push(interval_bytes(s.disk.iter().map(|d| d.write_bytes)));
    // Python: used = total − available to users (reserved blocks count as used).
    let (total, avail) = s.disk_space();
    let gb = |b: u64| num(b as f64 / 1e9, 6);
    cells.push(gb(total));
    cells.push(gb(total.saturating_sub(avail)));
    cells.push(gb(avail));
    cells.push(interval_bytes(s.network.iter().map(|n| n.rx_bytes)));
    cells.push(interval_bytes(s.network.iter().map(|n| n.tx_bytes)));
    let (gpu_usage, gpu_vram) = s.gpu_totals();
    let gpu_used = s
        .gpu
        .iter()
        .filter(|g| g.utilization_pct.is_some_and(|u| u > 0.0))
        .count();
    cells.push(num(gpu_usage, 4));
    cells.push(num(gpu_vram, 4));
    cells.push(gpu_used.to_string());
    match &s.process {
        Some(p) => {
            cells.push(p.pid.to_string());
            cells.push(opt_int(s.cpu.process_child_count));
            cells.push(num(p.utime_secs, 6));
            cells.push(num(p.stime_secs, 6));
            cells.push(opt_num(s.cpu.process_cores_used, 4));
            // Unique pages, as Python's PSS: the cgroup's charge where one holds
            // exactly the tree, else Σ PSS (`process_memory_source`).
            cells.push(num(p.memory_mib, 4));
            cells.push(p.read_bytes.to_string());
            cells.push(p.write_bytes.to_string());
            // Empty without a GPU collector (no GPU on the host).
            cells.push(opt_num(p.gpu_usage, 4));
            cells.push(opt_num(p.gpu_vram_mib, 4));
            cells.push(opt_int(p.gpu_utilized));
        }
        None => cells.extend(std::iter::repeat_n(String::new(), 11)),
    }
    // The Rust sibling's.
    cells.push(opt_num(s.cpu.steal_time_secs, 6));
    // Ours.
    cells.push(num(s.interval_secs, 6));
    cells.push(s.job_name.as_deref().map(text).unwrap_or_default());
    cells.push(opt_num(m.total_mib, 4));
    cells.push(opt_num(m.available_mib, 4));
    cells.push(opt_num(m.swap_total_mib, 4));
    cells.push(opt_num(m.swap_used_mib, 4));
    cells.push(opt_num(m.unavailable_mib, 4));
    cells.push(opt_num(s.cpu.cgroup_utilization_pct, 4));
    let tree = fields::csv_fields(TREE_FIELDS);
    match &s.process {
        Some(p) => cells.extend(tree.iter().map(|f| cell(f, p))),
        None => cells.extend(std::iter::repeat_n(String::new(), tree.len())),
    }
    cells.push(num(s.tracker.cpu_secs, 6));
    cells.push(num(s.tracker.rss_mib, 4));
    cells.push(s.tracker.lost_events.to_string());
    // The names only, `;`-separated (the detail is in the JSON and the summary).
    let names: Vec<&str> = s.tracker.degraded.iter().map(|d| d.name).collect();
    cells.push(text(&names.join(";")));
    cells.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_trimmed() {
        assert_eq!(num(1.5, 4), "1.5");
        assert_eq!(num(2.0, 4), "2");
        assert_eq!(num(-0.00001, 4), "0");
        assert_eq!(num(f64::NAN, 4), "");
        assert_eq!(text("a,b"), "\"a,b\"");
        assert_eq!(text("say \"x\""), "\"say \"\"x\"\"\"");
    }

    #[test]
    fn csv_doc_matches_columns() {
        let doc = include_str!("../../../docs/schema.md");
        let start = doc.find("## CSV").expect("CSV section");
        let body = &doc[start + 3..];
        let end = body.find("\n## ").unwrap_or(body.len());
        let documented: Vec<&str> = body[..end]
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        assert_eq!(documented, header().split(',').collect::<Vec<_>>());
    }

    #[test]
    fn row_has_one_cell_per_column() {
        let s = Sample::default();
        let cells = row(&s).split(',').count();
        assert_eq!(
            cells,
            PYTHON_COLUMNS.len()
                + SIBLING_COLUMNS.len()
                + EXTRA_COLUMNS.len()
                + fields::csv_columns("process", TREE_FIELDS).len()
                + TRACKER_COLUMNS.len()
        );
        assert_eq!(header().split(',').nth(32), Some("system_steal_time"));
        assert_eq!(header().split(',').count(), cells);
    }
}
