//! Recorded runs read back: this tool's JSON lines (samples, `--events` lines, the
//! `--summary` object) and CSV rows (this tool's, or the Python resource-tracker's
//! 32 columns), each line turned into the sample model the live run uses, so the
//! report's figures come from one code path.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use super::{
    fields::Cell,
    sample::{
        CpuSample, DiskSample, GpuSample, MemorySample, MemorySource, MountSample, NetworkSample,
        ProcessSample, Sample, TrackerSample, TREE_FIELDS,
    },
};

/// What one JSON line is.
pub enum JsonLine {
    Sample(Box<Sample>, Extra),
    Event(EventLine),
    Summary(Box<Value>),
}

/// What a sample line carries beyond the model's fields the report uses.
#[derive(Default)]
pub struct Extra {
    pub backend: Option<String>,
    pub degraded: Vec<String>,
}

#[derive(Deserialize)]
pub struct EventLine {
    pub kind: String,
    pub pid: u32,
    #[serde(default)]
    pub ppid: u32,
    #[serde(default)]
    pub comm: String,
    pub cpu_secs: Option<f64>,
    pub exit_code: Option<i32>,
    pub monotonic_secs: f64,
    /// Absent in files written before it existed: then aligned on the run's start.
    pub timestamp_secs: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JSample {
    timestamp_secs: Option<f64>,
    interval_secs: f64,
    job_name: Option<String>,
    tracked_pid: Option<u32>,
    cpu: JCpu,
    memory: JMemory,
    network: Vec<JBytes>,
    disk: Vec<JDisk>,
    gpu: Vec<JGpu>,
    process: Option<serde_json::Map<String, Value>>,
    tracker: JTracker,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JCpu {
    utilization_pct: Option<f64>,
    process_cores_used: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JMemory {
    used_mib: Option<f64>,
    unavailable_mib: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JBytes {
    rx_bytes: Option<u64>,
    tx_bytes: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JDisk {
    read_bytes: Option<u64>,
    write_bytes: Option<u64>,
    mounts: Vec<JMount>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JMount {
    total_bytes: u64,
    used_bytes: u64,
    available_bytes: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JGpu {
    utilization_pct: Option<f64>,
    vram_used_bytes: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JTracker {
    cpu_secs: f64,
    rss_mib: f64,
    lost_events: u64,
    degraded: Option<Value>,
}

/// `tracker.degraded` as short texts, whatever its items are (text, or objects
/// with a name and a detail).
fn degraded(v: Option<Value>) -> Vec<String> {
    let Some(Value::Array(items)) = v else {
        return Vec::new();
    };
    items
        .into_iter()
        .map(|i| match i {
            Value::String(s) => s,
            Value::Object(m) => {
                let get = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("");
                let (name, detail) = (get("name"), get("detail"));
                if detail.is_empty() {
                    name.to_string()
                } else {
                    format!("{name}: {detail}")
                }
            }
            other => other.to_string(),
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// One JSON line: a sample, a process event or a summary; an error names what
/// is wrong with it.
pub fn json_line(line: &str) -> Result<JsonLine, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let Value::Object(m) = &v else {
        return Err("not a JSON object".into());
    };
    if m.contains_key("timestamp_secs") && m.contains_key("cpu") {
        let j: JSample = serde_json::from_value(v).map_err(|e| format!("not a sample ({e})"))?;
        let s = sample_of(j)?;
        if let JsonLine::Sample(s, _) = &s {
            if let Some(why) = beyond_any_machine(s) {
                return Err(why);
            }
        }
        return Ok(s);
    }
    if m.contains_key("kind") && m.contains_key("monotonic_secs") {
        let e: EventLine =
            serde_json::from_value(v).map_err(|e| format!("not a process event ({e})"))?;
        return Ok(JsonLine::Event(e));
    }
    if m.contains_key("wall_secs") && m.contains_key("backend") {
        return Ok(JsonLine::Summary(Box::new(v)));
    }
    Err("neither a sample, a process event nor a run summary".into())
}

/// The most any machine has: x86-64's largest `CONFIG_NR_CPUS` (MAXSMP, 8192
/// cores) and its physical address space with 5-level paging (2^52 bytes), and far
/// more GPUs than a host can hold. A recorded figure past these is not a
/// measurement, and would turn into advice like `cpu=18446744073709551615`.
const MAX_CORES: f64 = 8192.0;
const MAX_MIB: f64 = (1u64 << 32) as f64;
const MAX_GPUS: f64 = 1024.0;

/// Why a recorded sample cannot be a measurement (a figure below 0 or past any
/// machine), naming the field and its bound; None when it can.
pub fn beyond_any_machine(s: &Sample) -> Option<String> {
    let p = s.process.as_ref();
    let checks: [(&str, Option<f64>, f64, &str); 8] = [
        (
            "process_cores_used",
            s.cpu.process_cores_used,
            MAX_CORES,
            "cores",
        ),
        (
            "cpu utilization",
            s.cpu.utilization_pct,
            MAX_CORES * 100.0,
            "%",
        ),
        ("system memory", s.memory.unavailable_mib, MAX_MIB, "MiB"),
        (
            "process memory_mib",
            p.map(|p| p.memory_mib),
            MAX_MIB,
            "MiB",
        ),
        (
            "process memory_peak_mib",
            p.and_then(|p| p.memory_peak_mib),
            MAX_MIB,
            "MiB",
        ),
        (
            "process gpu_usage",
            p.and_then(|p| p.gpu_usage),
            MAX_GPUS,
            "GPUs",
        ),
        (
            "process gpu_vram_mib",
            p.and_then(|p| p.gpu_vram_mib),
            MAX_MIB,
            "MiB",
        ),
        (
            "process gpu_utilized",
            p.and_then(|p| p.gpu_utilized).map(|g| g as f64),
            MAX_GPUS,
            "GPUs",
        ),
    ];
    checks.iter().find_map(|&(name, v, max, unit)| {
        let v = v?;
        // 1e308 as such, not as its 309 digits.
        let v_ = if v.abs() < 1e9 {
            v.to_string()
        } else {
            format!("{v:e}")
        };
        if v.is_nan() || v < 0.0 {
            Some(format!("{name} {v_} is not a measurement (below 0)"))
        } else if v > max {
            Some(format!(
                "{name} {v_} is beyond any machine (at most {max} {unit}); the sample is left out"
            ))
        } else {
            None
        }
    })
}

/// The tree's object of a recorded sample: every field the registry knows, read by
/// its own type; keys it does not know (other versions') are left alone.
fn process_of_json(m: &serde_json::Map<String, Value>) -> Result<ProcessSample, String> {
    let mut p = ProcessSample::default();
    for f in TREE_FIELDS {
        let Some(v) = m.get(f.name) else { continue };
        let c =
            Cell::of_json(v).ok_or_else(|| format!("process.{}: {v} is not a value", f.name))?;
        f.read(&mut p, c, &format!("process.{}", f.name))?;
    }
    // Files of versions before `memory_source`: PSS with --pss, else RSS.
    if !m.contains_key("memory_mib") {
        p.memory_mib = p.memory_pss_mib.unwrap_or(p.memory_rss_mib);
    }
    if !m.contains_key("memory_source") {
        p.memory_source = if p.memory_pss_mib.is_some() {
            MemorySource::Pss
        } else {
            MemorySource::Rss
        }
        .as_str();
    }
    Ok(p)
}

fn sample_of(j: JSample) -> Result<JsonLine, String> {
    let extra = Extra {
        backend: j
            .process
            .as_ref()
            .and_then(|p| p.get("backend"))
            .and_then(Value::as_str)
            .map(str::to_string),
        degraded: degraded(j.tracker.degraded),
    };
    let process = j.process.as_ref().map(process_of_json).transpose()?;
    let s = Sample {
        timestamp_secs: j.timestamp_secs.unwrap_or(f64::NAN),
        interval_secs: j.interval_secs,
        job_name: j.job_name,
        tracked_pid: j.tracked_pid,
        cpu: CpuSample {
            utilization_pct: j.cpu.utilization_pct,
            process_cores_used: j.cpu.process_cores_used,
            ..Default::default()
        },
        memory: MemorySample {
            used_mib: j.memory.used_mib,
            unavailable_mib: j.memory.unavailable_mib,
            ..Default::default()
        },
        network: j
            .network
            .into_iter()
            .map(|n| NetworkSample {
                rx_bytes: n.rx_bytes,
                tx_bytes: n.tx_bytes,
                ..Default::default()
            })
            .collect(),
        disk: j
            .disk
            .into_iter()
            .map(|d| DiskSample {
                read_bytes: d.read_bytes,
                write_bytes: d.write_bytes,
                mounts: d
                    .mounts
                    .into_iter()
                    .map(|m| MountSample {
                        total_bytes: m.total_bytes,
                        used_bytes: m.used_bytes,
                        available_bytes: m.available_bytes,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        gpu: j
            .gpu
            .into_iter()
            .map(|g| GpuSample {
                utilization_pct: g.utilization_pct,
                vram_used_bytes: g.vram_used_bytes,
                ..Default::default()
            })
            .collect(),
        process,
        tracker: TrackerSample {
            cpu_secs: j.tracker.cpu_secs,
            rss_mib: j.tracker.rss_mib,
            lost_events: j.tracker.lost_events,
            ..Default::default()
        },
        ..Default::default()
    };
    Ok(JsonLine::Sample(Box::new(s), extra))
}

/// Splits one CSV record (RFC 4180 quoting, no line breaks inside a field).
pub fn split_csv(line: &str) -> Result<Vec<String>, &'static str> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (false, '"') if at_start => {
                quoted = true;
                at_start = false;
            }
            (true, '"') => {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            }
            (false, ',') => {
                out.push(std::mem::take(&mut cur));
                at_start = true;
            }
            (_, c) => {
                cur.push(c);
                at_start = false;
            }
        }
    }
    if quoted {
        return Err("a quoted field is not closed");
    }
    out.push(cur);
    Ok(out)
}

/// One CSV row's cells by column name.
struct Row<'a> {
    index: &'a HashMap<String, usize>,
    cells: Vec<String>,
}

impl Row<'_> {
    /// The cell of column `name`, None where the file has no such column or the
    /// cell is empty.
    fn get(&self, name: &str) -> Option<&str> {
        self.index
            .get(name)
            .map(|&i| self.cells[i].trim())
            .filter(|c| !c.is_empty())
    }

    fn num(&self, name: &str) -> Result<Option<f64>, String> {
        self.get(name)
            .map(|c| {
                c.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| format!("{name}: '{}' is not a number", c.escape_debug()))
            })
            .transpose()
    }

    fn bytes(&self, name: &str) -> Result<Option<u64>, String> {
        Ok(self.num(name)?.map(|v| v.max(0.0) as u64))
    }
}

/// The host's storage of a row: bytes moved and the space of its one mount.
fn disk_of(r: &Row) -> Result<DiskSample, String> {
    let (total_gb, used_gb) = (
        r.num("system_disk_space_total_gb")?,
        r.num("system_disk_space_used_gb")?,
    );
    Ok(DiskSample {
        read_bytes: r.bytes("system_disk_read_bytes")?,
        write_bytes: r.bytes("system_disk_write_bytes")?,
        mounts: match (total_gb, used_gb) {
            (Some(t), Some(u)) => vec![MountSample {
                total_bytes: (t * 1e9) as u64,
                used_bytes: (u * 1e9) as u64,
                // The report's used space is total − available.
                available_bytes: ((t - u).max(0.0) * 1e9) as u64,
                ..Default::default()
            }],
            _ => Vec::new(),
        },
        ..Default::default()
    })
}

/// The tracked tree's part of a row: every field the registry gives a column of
/// ours or of the Python package's, read by its own type.
fn process_of(r: &Row) -> Result<ProcessSample, String> {
    let mut p = ProcessSample::default();
    for f in TREE_FIELDS {
        let ours = f.csv.map(|_| format!("process_{}", f.name));
        let Some(col) = ours.as_deref().or(f.python_csv) else {
            continue;
        };
        if let Some(c) = r.get(col) {
            f.read(&mut p, Cell::of_csv(c), col)?;
        }
    }
    // Files without the column: what it was before, PSS with --pss or RSS, taken as
    // RSS.
    if r.get("process_memory_source").is_none() {
        p.memory_source = MemorySource::Rss.as_str();
    }
    if r.get("process_memory_rss_mib").is_none() {
        p.memory_rss_mib = p.memory_mib;
    }
    if r.get("process_live_processes").is_none() {
        p.live_processes = r.bytes("process_children")?.map_or(0, |c| c + 1);
    }
    Ok(p)
}

/// Reads CSV rows by their header's names, so that the Python package's 32
/// columns, ours, and files with columns this version does not know all work.
pub struct CsvRows {
    index: HashMap<String, usize>,
    width: usize,
    /// The Python package's file has no interval column: each row's interval is
    /// the time since the row before, the first row's that of the second.
    has_interval: bool,
    prev_ts: Option<f64>,
    /// The first row, held until the second gives its interval.
    held: Option<Sample>,
    pub python: bool,
}

/// Columns without which a CSV file is not a tracker's.
const REQUIRED: [&str; 2] = ["timestamp", "process_cpu_usage"];

impl CsvRows {
    pub fn new(header: &str) -> Result<CsvRows, String> {
        let names = split_csv(header.trim_end_matches('\r')).map_err(|e| format!("header: {e}"))?;
        let index: HashMap<String, usize> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.trim().to_string(), i))
            .collect();
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|c| !index.contains_key(*c))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the CSV header lacks {} (not a resource-tracker CSV file)",
                missing.join(", ")
            ));
        }
        Ok(CsvRows {
            has_interval: index.contains_key("interval_secs"),
            python: !index.contains_key("system_steal_time"),
            width: names.len(),
            index,
            prev_ts: None,
            held: None,
        })
    }

    /// One row; samples ready to add (none while the first row is held, two when
    /// the second arrives).
    pub fn row(&mut self, line: &str) -> Result<Vec<(Sample, Extra)>, String> {
        let cells = split_csv(line.trim_end_matches('\r')).map_err(str::to_string)?;
        if cells.len() != self.width {
            return Err(format!(
                "{} fields where the header has {}",
                cells.len(),
                self.width
            ));
        }
        let r = Row {
            index: &self.index,
            cells,
        };
        let (get, num, bytes) = (|n| r.get(n), |n| r.num(n), |n| r.bytes(n));
        let ts = num("timestamp")?.ok_or("timestamp: empty")?;
        let interval = match (self.has_interval, num("interval_secs")?, self.prev_ts) {
            (true, Some(i), _) => i,
            (_, _, Some(p)) => ts - p,
            _ => 0.0,
        };
        let gpu_sys = num("system_gpu_usage")?;
        let tree = get("process_pid").is_some() || num("process_cpu_usage")?.is_some();
        let backend = get("process_backend").map(str::to_string);
        let s = Sample {
            timestamp_secs: ts,
            interval_secs: interval,
            job_name: get("job_name").map(str::to_string),
            cpu: CpuSample {
                utilization_pct: num("system_cpu_usage")?,
                process_cores_used: num("process_cpu_usage")?,
                process_child_count: bytes("process_children")?,
                ..Default::default()
            },
            memory: MemorySample {
                used_mib: num("system_memory_used_mib")?,
                unavailable_mib: num("system_memory_unavailable_mib")?
                    .or(num("system_memory_used_mib")?),
                ..Default::default()
            },
            network: vec![NetworkSample {
                rx_bytes: bytes("system_net_recv_bytes")?,
                tx_bytes: bytes("system_net_sent_bytes")?,
                ..Default::default()
            }],
            disk: vec![disk_of(&r)?],
            gpu: match (gpu_sys, num("system_gpu_vram_mib")?) {
                (None, None) => Vec::new(),
                (u, v) => vec![GpuSample {
                    utilization_pct: u.map(|u| u * 100.0),
                    vram_used_bytes: v.map(|v| (v * 1048576.0) as u64),
                    ..Default::default()
                }],
            },
            process: tree.then(|| process_of(&r)).transpose()?,
            tracker: TrackerSample {
                cpu_secs: num("tracker_cpu_secs")?.unwrap_or(0.0),
                rss_mib: num("tracker_rss_mib")?.unwrap_or(0.0),
                lost_events: bytes("tracker_lost_events")?.unwrap_or(0),
                ..Default::default()
            },
            ..Default::default()
        };
        if let Some(why) = beyond_any_machine(&s) {
            return Err(why);
        }
        let degraded: Vec<String> = get("tracker_degraded")
            .map(|d| {
                d.split(';')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let extra = || Extra {
            backend: backend.clone(),
            degraded: degraded.clone(),
        };
        let first = self.prev_ts.is_none();
        self.prev_ts = Some(ts);
        if self.has_interval {
            return Ok(vec![(s, extra())]);
        }
        if first {
            self.held = Some(s);
            return Ok(Vec::new());
        }
        match self.held.take() {
            None => Ok(vec![(s, extra())]),
            Some(mut held) => {
                held.interval_secs = interval;
                Ok(vec![(held, extra()), (s, extra())])
            }
        }
    }

    /// The held first row of a one-row file, with the interval unknown (1 s).
    pub fn finish(&mut self) -> Option<Sample> {
        self.held.take().map(|mut s| {
            s.interval_secs = 1.0;
            s
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_with_quotes() {
        assert_eq!(
            split_csv("a,\"b,c\",\"d\"\"e\",").unwrap(),
            ["a", "b,c", "d\"e", ""]
        );
        assert!(split_csv("a,\"b").is_err());
    }

    #[test]
    fn python_csv_rows_take_their_interval_from_the_next_row() {
        let header = crate::model::csv::PYTHON_COLUMNS.join(",");
        let mut r = CsvRows::new(&header).unwrap();
        assert!(r.python);
        let row = |ts: f64, cpu: f64| {
            let mut cells = vec![String::new(); 32];
            cells[0] = ts.to_string();
            cells[21] = "7".into();
            cells[25] = cpu.to_string();
            cells[26] = "100".into();
            cells.join(",")
        };
        assert!(r.row(&row(100.0, 1.0)).unwrap().is_empty());
        let two = r.row(&row(102.0, 2.0)).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].0.interval_secs, 2.0);
        assert_eq!(two[1].0.cpu.process_cores_used, Some(2.0));
        assert_eq!(two[1].0.process.as_ref().unwrap().memory_rss_mib, 100.0);
        let e = r.row("1,2").err().unwrap();
        assert!(e.contains("2 fields where the header has 32"), "{e}");
        let mut bad = vec![String::new(); 32];
        bad[0] = "103".into();
        bad[25] = "x".into();
        assert_eq!(
            r.row(&bad.join(",")).err().unwrap(),
            "process_cpu_usage: 'x' is not a number"
        );
        assert!(CsvRows::new("a,b").is_err());
    }

    #[test]
    fn json_lines_are_told_apart() {
        let ev = r#"{"kind":"exit","pid":5,"ppid":1,"comm":"x","cpu_secs":0.1,"exit_code":0,"monotonic_secs":5.0}"#;
        assert!(matches!(json_line(ev), Ok(JsonLine::Event(_))));
        let s = r#"{"timestamp_secs":10.5,"interval_secs":1,"cpu":{"process_cores_used":1.5},"process":{"backend":"ebpf","memory_rss_mib":3},"tracker":{"degraded":["btf_missing: x",{"name":"map_full","detail":"y"}]}}"#;
        match json_line(s) {
            Ok(JsonLine::Sample(s, extra)) => {
                assert_eq!(s.cpu.process_cores_used, Some(1.5));
                assert_eq!(s.process.unwrap().backend, "ebpf");
                assert_eq!(extra.degraded, ["btf_missing: x", "map_full: y"]);
            }
            _ => panic!("not a sample"),
        }
        assert!(json_line(r#"{"wall_secs":1,"backend":"ebpf"}"#).is_ok());
        assert!(json_line("[1]").is_err());
        assert!(json_line(r#"{"timestamp_secs":"x","cpu":{}}"#).is_err());
        assert!(json_line("{\"timestamp_secs\": 1,").is_err());
    }

    /// A tree with every field of the registry set apart from its default (so a
    /// new field is covered without a word here).
    fn a_tree() -> ProcessSample {
        let mut p = ProcessSample::default();
        for (i, f) in TREE_FIELDS.iter().enumerate() {
            let ty = (f.ty)();
            let c = if !f.names.is_empty() {
                Cell::Text(f.names[i % f.names.len()])
            } else if ty.starts_with("boolean") {
                Cell::Flag(true)
            } else if ty.starts_with("integer") {
                Cell::Int(i as u64 + 1)
            } else {
                Cell::Num(i as f64 + 0.25)
            };
            f.read(&mut p, c, f.name).expect("a value of its type");
        }
        p
    }

    /// The tree's object of a JSON line reads back into the same object, byte for
    /// byte: the writer (serde) and the reader (the registry) agree on every field.
    #[test]
    fn a_json_tree_reads_back_byte_for_byte() {
        let tree = serde_json::to_string(&a_tree()).unwrap();
        let line = format!(
            r#"{{"timestamp_secs":1,"interval_secs":1,"cpu":{{}},"process":{tree},"tracker":{{}}}}"#
        );
        let Ok(JsonLine::Sample(s, extra)) = json_line(&line) else {
            panic!("not a sample")
        };
        assert_eq!(serde_json::to_string(&s.process).unwrap(), tree);
        assert_eq!(extra.backend.as_deref(), Some(a_tree().backend));
        let threads = format!(r#""live_threads":{}"#, a_tree().live_threads);
        let wrong = line.replace(&threads, r#""live_threads":"nine""#);
        assert_eq!(
            json_line(&wrong).err().unwrap(),
            "process.live_threads: 'nine' is not a number"
        );
    }

    /// A CSV row of ours reads back into the tree's columns it has: a row written
    /// from what was read is the row read.
    #[test]
    fn a_csv_tree_reads_back_byte_for_byte() {
        let s = Sample {
            timestamp_secs: 100.0,
            interval_secs: 1.0,
            cpu: CpuSample {
                process_cores_used: Some(1.5),
                process_child_count: Some(4),
                ..Default::default()
            },
            process: Some(a_tree()),
            ..Default::default()
        };
        let row = super::super::csv::row(&s);
        let mut r = CsvRows::new(&super::super::csv::header()).unwrap();
        let back = r.row(&row).unwrap();
        assert_eq!(super::super::csv::row(&back[0].0), row);
    }
}
