//! The samples as OpenTelemetry metrics: which field is which metric, in which
//! unit, of which kind, with which attributes (docs/otlp.md is rendered from
//! here), and the running totals that turn a field's growth over each interval
//! into the cumulative sum OTLP wants for a counter. The sink only encodes.

use super::{
    fields::{Kind, MIB},
    node::{Current, NodeSnapshot},
    sample::{Sample, TREE_FIELDS},
};

/// A metric's description: the first sentence of the field's doc comment.
pub fn description(doc: &str) -> String {
    let one = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    match one.find("; ").or_else(|| one.find(". ")) {
        Some(i) => one[..i].to_string(),
        None => one.trim_end_matches('.').to_string(),
    }
}

/// One data point: a metric, its attributes, its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub name: &'static str,
    pub unit: &'static str,
    /// The field's doc comment or the metric's description: `description()`
    /// makes the metric's of it, once per request.
    pub description: &'static str,
    pub kind: Kind,
    pub attrs: Vec<(&'static str, String)>,
    pub value: f64,
    /// Whether the value is a whole number (OTLP's as_int).
    pub int: bool,
}

/// A point's attributes.
pub type Attrs = Vec<(&'static str, String)>;

/// The metrics that are not the tree's fields (the host's, the tracker's, a
/// container's on the node): name, unit, kind, attributes (as docs/otlp.md lists
/// them), the figure it comes from and what it reads of `S`.
pub struct Mapped<S> {
    pub name: &'static str,
    pub unit: &'static str,
    pub kind: Kind,
    /// docs/otlp.md's columns.
    #[cfg_attr(not(test), allow(dead_code))]
    pub attrs: &'static str,
    #[cfg_attr(not(test), allow(dead_code))]
    pub field: &'static str,
    pub description: &'static str,
    read: fn(&S) -> Vec<(Attrs, f64)>,
}

pub type HostMetric = Mapped<Sample>;

fn one(v: Option<f64>) -> Vec<(Attrs, f64)> {
    v.map(|v| vec![(vec![], v)]).unwrap_or_default()
}

pub const HOST_METRICS: &[HostMetric] = &[
    HostMetric {
        name: "system.memory.usage",
        unit: "By",
        kind: Kind::Gauge,
        attrs: "`system.memory.state`: `used`",
        field: "memory.used_mib",
        description: "the host's memory in use",
        read: |s| {
            s.memory
                .used_mib
                .map(|v| vec![(vec![("system.memory.state", "used".into())], v * MIB)])
                .unwrap_or_default()
        },
    },
    HostMetric {
        name: "system.memory.limit",
        unit: "By",
        kind: Kind::Gauge,
        attrs: "",
        field: "memory.total_mib",
        description: "the host's memory",
        read: |s| one(s.memory.total_mib.map(|v| v * MIB)),
    },
    HostMetric {
        name: "system.network.io",
        unit: "By",
        kind: Kind::Total,
        attrs: "`network.interface.name`, `network.io.direction`: `receive`/`transmit`",
        field: "network[].rx_bytes_total, tx_bytes_total",
        description: "bytes through each interface since boot",
        read: |s| {
            s.network
                .iter()
                .flat_map(|n| {
                    [
                        ("receive", n.rx_bytes_total),
                        ("transmit", n.tx_bytes_total),
                    ]
                    .map(|(d, v)| {
                        (
                            vec![
                                ("network.interface.name", n.interface.clone()),
                                ("network.io.direction", d.to_string()),
                            ],
                            v as f64,
                        )
                    })
                })
                .collect()
        },
    },
    HostMetric {
        name: "system.disk.io",
        unit: "By",
        kind: Kind::Total,
        attrs: "`system.device`, `disk.io.direction`: `read`/`write`",
        field: "disk[].read_bytes_total, write_bytes_total",
        description: "bytes read from and written to each disk since boot",
        read: |s| {
            s.disk
                .iter()
                .flat_map(|d| {
                    [("read", d.read_bytes_total), ("write", d.write_bytes_total)]
                        .into_iter()
                        .filter_map(|(dir, v)| {
                            let v = v? as f64;
                            Some((
                                vec![
                                    ("system.device", d.device.clone()),
                                    ("disk.io.direction", dir.to_string()),
                                ],
                                v,
                            ))
                        })
                })
                .collect()
        },
    },
    HostMetric {
        name: "resource_tracker.tracker.cpu.time",
        unit: "s",
        kind: Kind::Growth,
        attrs: "",
        field: "tracker.cpu_secs",
        description: "the tracker's own CPU, summed from its start",
        read: |s| one(Some(s.tracker.cpu_secs)),
    },
    HostMetric {
        name: "resource_tracker.tracker.memory.usage",
        unit: "By",
        kind: Kind::Gauge,
        attrs: "",
        field: "tracker.rss_mib",
        description: "the tracker's own resident memory",
        read: |s| one(Some(s.tracker.rss_mib * MIB)),
    },
    HostMetric {
        name: "resource_tracker.tracker.lost_events",
        unit: "{event}",
        kind: Kind::Total,
        attrs: "",
        field: "tracker.lost_events_total",
        description: "kernel events the tracker lost (0 means exact)",
        read: |s| one(Some(s.tracker.lost_events_total as f64)),
    },
];

fn some_u(v: Option<u64>, scale: f64) -> Vec<(Attrs, f64)> {
    one(v.map(|v| v as f64 * scale))
}

/// A container's metrics on the node, from its cgroup's counters (totals since
/// the cgroup was made) and, with the BPF programs, its process life cycle.
pub const CONTAINER_METRICS: &[Mapped<Current>] = &[
    Mapped {
        name: "container.cpu.time",
        unit: "s",
        kind: Kind::Total,
        attrs: "",
        field: "cpu.stat usage_usec (v1 cpuacct.usage)",
        description: "the container's CPU since its cgroup was made",
        read: |c| some_u(c.counters.cpu_usage_ns, 1e-9),
    },
    Mapped {
        name: "resource_tracker.container.cpu.throttled_time",
        unit: "s",
        kind: Kind::Total,
        attrs: "",
        field: "cpu.stat throttled_usec",
        description: "time the container's CPU quota held it back",
        read: |c| some_u(c.counters.cfs_throttled_ns, 1e-9),
    },
    Mapped {
        name: "container.memory.usage",
        unit: "By",
        kind: Kind::Gauge,
        attrs: "",
        field: "memory.current (v1 memory.usage_in_bytes)",
        description: "the container's memory charge",
        read: |c| some_u(c.counters.memory_bytes, 1.0),
    },
    Mapped {
        name: "resource_tracker.container.memory.working_set",
        unit: "By",
        kind: Kind::Gauge,
        attrs: "",
        field: "memory.current − inactive_file",
        description: "the container's working set, as the kubelet counts it",
        read: |c| some_u(c.counters.working_set_bytes, 1.0),
    },
    Mapped {
        name: "resource_tracker.container.memory.peak",
        unit: "By",
        kind: Kind::Gauge,
        attrs: "",
        field: "memory.peak (v1 memory.max_usage_in_bytes)",
        description: "the container's memory peak",
        read: |c| some_u(c.counters.memory_peak_bytes, 1.0),
    },
    Mapped {
        name: "resource_tracker.container.oom_kills",
        unit: "{process}",
        kind: Kind::Total,
        attrs: "",
        field: "memory.events oom_kill",
        description: "processes the OOM killer ended in the container",
        read: |c| some_u(c.counters.oom_kills, 1.0),
    },
    Mapped {
        name: "container.disk.io",
        unit: "By",
        kind: Kind::Total,
        attrs: "`disk.io.direction`: `read`/`write`",
        field: "io.stat rbytes, wbytes",
        description: "bytes the container read from and wrote to storage",
        read: |c| {
            [
                ("read", c.counters.read_bytes),
                ("write", c.counters.write_bytes),
            ]
            .into_iter()
            .filter_map(|(d, v)| Some((vec![("disk.io.direction", d.to_string())], v? as f64)))
            .collect()
        },
    },
    Mapped {
        name: "resource_tracker.container.tasks",
        unit: "{task}",
        kind: Kind::Gauge,
        attrs: "",
        field: "pids.current",
        description: "the container's tasks",
        read: |c| some_u(c.counters.tasks, 1.0),
    },
    Mapped {
        name: "resource_tracker.container.process.spawned",
        unit: "{process}",
        kind: Kind::Total,
        attrs: "",
        field: "the node's BPF programs",
        description: "processes started in the container since the agent began",
        read: |c| one(c.counters.life.map(|l| l.spawned as f64)),
    },
    Mapped {
        name: "resource_tracker.container.process.exited",
        unit: "{process}",
        kind: Kind::Total,
        attrs: "",
        field: "the node's BPF programs",
        description: "processes of the container that ended since the agent began",
        read: |c| one(c.counters.life.map(|l| l.exited as f64)),
    },
];

/// The container's resource attributes: the semantic conventions' `k8s.*` and
/// `container.id` where the path or the kubelet named them, and its cgroup.
pub fn container_resource(c: &Current) -> Attrs {
    let f = &c.found;
    let mut out = vec![("resource_tracker.cgroup", format!("/{}", f.rel))];
    if let Some(u) = &f.pod_uid {
        out.push(("k8s.pod.uid", u.clone()));
    }
    if let Some(i) = &f.container_id {
        out.push(("container.id", i.clone()));
    }
    if let Some(q) = f.qos {
        out.push(("resource_tracker.qos", q.to_string()));
    }
    if let Some(n) = &c.names {
        out.push(("k8s.namespace.name", n.namespace.clone()));
        out.push(("k8s.pod.name", n.pod.clone()));
        out.push(("k8s.container.name", n.container.clone()));
        out.push(("container.image.name", n.image.clone()));
    }
    out
}

/// The node agent's own cost, under the node's resource alone.
pub const AGENT_METRICS: &[Mapped<NodeSnapshot>] = &[
    Mapped {
        name: "resource_tracker.tracker.cpu.time",
        unit: "s",
        kind: Kind::Total,
        attrs: "",
        field: "the agent's CPU (getrusage)",
        description: "the agent's own CPU since its start",
        read: |n| one(Some(n.agent_cpu_secs)),
    },
    Mapped {
        name: "resource_tracker.tracker.memory.usage",
        unit: "By",
        kind: Kind::Gauge,
        attrs: "",
        field: "the agent's resident set (/proc/self/statm)",
        description: "the agent's own resident memory",
        read: |n| some_u(Some(n.agent_rss_bytes), 1.0),
    },
];

/// The points `table` reads of `s`, appended to `out`; `int` says which are
/// whole numbers.
fn mapped<S>(
    table: &[Mapped<S>],
    s: &S,
    int: fn(&Mapped<S>) -> bool,
    totals: &mut Totals,
    out: &mut Vec<Point>,
) {
    for m in table {
        for (attrs, v) in (m.read)(s) {
            let meta = (m.name, m.unit, m.kind, m.description);
            out.push(point(totals, meta, attrs, v, int(m)));
        }
    }
}

/// The node's points: each container's under its resource, then the agent's own
/// (no container attributes). The node's figures are the kernel's totals: none
/// is a growth to add up in `totals`.
pub fn node_points(n: &NodeSnapshot, totals: &mut Totals) -> Vec<(Attrs, Vec<Point>)> {
    // Counters and byte counts from the cgroups are whole; seconds are not.
    let int = |m: &Mapped<Current>| m.unit != "s";
    let mut out = Vec::with_capacity(n.containers.len() + 1);
    for c in &n.containers {
        let mut pts = Vec::new();
        mapped(CONTAINER_METRICS, c, int, totals, &mut pts);
        out.push((container_resource(c), pts));
    }
    let mut own = Vec::new();
    mapped(AGENT_METRICS, n, |m| m.unit != "s", totals, &mut own);
    out.push((vec![], own));
    out
}

/// The running totals of the `Growth` metrics, by metric and attributes.
#[derive(Default)]
pub struct Totals {
    sums: Vec<((&'static str, Attrs), f64)>,
}

impl Totals {
    fn add(&mut self, name: &'static str, attrs: &[(&'static str, String)], v: f64) -> f64 {
        match self
            .sums
            .iter_mut()
            .find(|((n, a), _)| *n == name && a.as_slice() == attrs)
        {
            Some((_, t)) => {
                *t += v;
                *t
            }
            None => {
                self.sums.push(((name, attrs.to_vec()), v));
                v
            }
        }
    }
}

fn point(
    totals: &mut Totals,
    (name, unit, kind, description): (&'static str, &'static str, Kind, &'static str),
    attrs: Vec<(&'static str, String)>,
    v: f64,
    int: bool,
) -> Point {
    let value = match kind {
        Kind::Growth => totals.add(name, &attrs, v),
        _ => v,
    };
    Point {
        name,
        unit,
        description,
        kind,
        attrs,
        value,
        int,
    }
}

/// Every metric of one sample: the tree's fields that have one (none for a
/// host-only run), then the host's and the tracker's.
pub fn points(s: &Sample, totals: &mut Totals) -> Vec<Point> {
    use super::fields::Cell;
    let mut out = Vec::new();
    if let Some(p) = &s.process {
        for f in TREE_FIELDS {
            let Some(o) = f.otlp else { continue };
            let (v, int) = match (f.get)(p) {
                Cell::Int(i) => (i as f64, o.scale == 1.0),
                Cell::Num(x) => (x, false),
                Cell::Flag(b) => (f64::from(u8::from(b)), true),
                Cell::Null | Cell::Text(_) => continue,
            };
            let attrs = o.attrs.iter().map(|(k, v)| (*k, v.to_string())).collect();
            let meta = (o.name, o.unit, o.kind, f.doc);
            out.push(point(totals, meta, attrs, v * o.scale, int));
        }
    }
    // The host's byte counters and event counts are whole; its memory, from
    // MiB, and seconds are not.
    let int = |m: &HostMetric| m.unit == "{event}" || (m.unit == "By" && m.kind == Kind::Total);
    mapped(HOST_METRICS, s, int, totals, &mut out);
    out
}

/// docs/otlp.md's table: every field that is exported, from the registry and
/// `HOST_METRICS`.
#[cfg(test)]
pub fn table() -> String {
    let kind = |k: Kind| match k {
        Kind::Gauge => "gauge",
        Kind::Total | Kind::Growth => "cumulative sum",
    };
    let mut out = String::from(
        "| our field | OTLP metric | unit | type | attributes |\n|---|---|---|---|---|\n",
    );
    let mut row = |field: String, kind_: Kind, name: &str, unit: &str, attrs: &str| {
        let growth = if kind_ == Kind::Growth {
            " (its growth per interval, added up)"
        } else {
            ""
        };
        let k = kind(kind_);
        // A row without a metric heads the rows after it.
        out.push_str(&if name.is_empty() {
            format!("| **{field}** | | | | |\n")
        } else {
            format!("| `{field}`{growth} | `{name}` | `{unit}` | {k} | {attrs} |\n")
        });
    };
    for f in TREE_FIELDS {
        let Some(o) = f.otlp else { continue };
        let attrs = o
            .attrs
            .iter()
            .map(|(k, v)| format!("`{k}`: `{v}`"))
            .collect::<Vec<_>>()
            .join(", ");
        row(
            format!("process.{}", f.name),
            o.kind,
            o.name,
            o.unit,
            &attrs,
        );
    }
    for m in HOST_METRICS {
        row(m.field.to_string(), m.kind, m.name, m.unit, m.attrs);
    }
    row("the node, per container".into(), Kind::Gauge, "", "", "");
    for m in CONTAINER_METRICS {
        row(m.field.to_string(), m.kind, m.name, m.unit, m.attrs);
    }
    for m in AGENT_METRICS {
        row(m.field.to_string(), m.kind, m.name, m.unit, m.attrs);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sample::ProcessSample;

    #[test]
    fn growth_adds_up_and_totals_are_kept_as_they_are() {
        let mut t = Totals::default();
        let mut s = Sample {
            process: Some(ProcessSample {
                cpu_secs_total: 1.5,
                processes_spawned: 3,
                read_bytes: 10,
                memory_mib: 2.0,
                ..Default::default()
            }),
            ..Default::default()
        };
        let find = |pts: &[Point], n: &str, a: &[(&str, &str)]| {
            pts.iter()
                .find(|p| {
                    p.name == n
                        && a.iter()
                            .all(|(k, v)| p.attrs.iter().any(|(pk, pv)| pk == k && pv == v))
                })
                .map(|p| p.value)
        };
        let p1 = points(&s, &mut t);
        if let Some(p) = s.process.as_mut() {
            p.cpu_secs_total = 2.5;
            p.processes_spawned = 2;
            p.read_bytes = 5;
        }
        let p2 = points(&s, &mut t);
        assert_eq!(find(&p1, "process.cpu.time", &[]), Some(1.5));
        assert_eq!(find(&p2, "process.cpu.time", &[]), Some(2.5));
        assert_eq!(
            find(&p2, "resource_tracker.process.spawned", &[]),
            Some(5.0)
        );
        let read = [("disk.io.direction", "read")];
        assert_eq!(find(&p2, "process.disk.io", &read), Some(15.0));
        assert_eq!(find(&p2, "process.memory.usage", &[]), Some(2.0 * MIB));
        // A host-only sample has the host's metrics only.
        let host = points(&Sample::default(), &mut Totals::default());
        assert!(
            host.iter().all(|p| !p.name.starts_with("process.")),
            "{host:?}"
        );
    }

    #[test]
    fn docs_otlp_md_is_the_registrys() {
        crate::model::fields::check_block(
            "docs/otlp.md",
            "## The metrics",
            |l| l.starts_with('|'),
            false,
            &table(),
        );
    }
}
