//! Every value a user can give, wrong in every way we know of: flags, the config
//! file, the environment. Each case must end in one line that names the input and
//! the documented exit code (2: the input is wrong; 1: a file cannot be made), with
//! no panic and without starting the command. docs/bad-input.md is this table;
//! `TRACKER_BLESS=1 cargo test -p tracker-tests --test bad_input_table` rewrites it
//! from what the binary says, and the test fails while the two differ.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use tracker_tests::*;

struct Case {
    /// What the user gave, as the table shows it.
    input: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// A config file's body; `{cfg}` in `args` names it.
    config: Option<String>,
    code: i32,
    /// Text the message must hold (the flag, variable or key, and the value).
    needles: Vec<String>,
    /// Whether the command runs all the same (an output someone else's file
    /// stands at goes to a private file instead).
    starts: bool,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// A case on the command line; `{dir}`, `{file}`, `{link}` and `{cfg}` are
/// replaced by scratch paths (a directory, a regular file, a link to the
/// directory, the config file).
fn flag(args: &[&str], code: i32, needles: &[&str]) -> Case {
    Case {
        input: args.join(" "),
        args: s(args),
        env: Vec::new(),
        config: None,
        code,
        needles: s(needles),
        starts: false,
    }
}

fn env(var: &str, value: &str, code: i32, needles: &[&str]) -> Case {
    Case {
        input: format!("{var}={value:?}"),
        args: s(&["run", "--", "touch", "{dir}/started"]),
        env: vec![(var.to_string(), value.to_string())],
        config: None,
        code,
        needles: s(needles),
        starts: false,
    }
}

/// With a token, so that the streaming variables are read.
fn stream_env(var: &str, value: &str, needles: &[&str]) -> Case {
    let mut c = env(var, value, 2, needles);
    c.env.push(("SENTINEL_API_TOKEN".into(), "t0ken".into()));
    c
}

fn config(body: &str, needles: &[&str]) -> Case {
    Case {
        input: format!("config: {}", body.trim().replace('\n', " ⏎ ")),
        args: s(&["run", "-c", "{cfg}", "--", "touch", "{dir}/started"]),
        env: Vec::new(),
        config: Some(body.to_string()),
        code: 2,
        needles: s(needles),
        starts: false,
    }
}

fn run_flag(f: &str, v: &str, needles: &[&str]) -> Case {
    flag(&["run", f, v, "--", "touch", "{dir}/started"], 2, needles)
}

const BAD_SECONDS: [&str; 11] = [
    "0", "-1", "abc", "nan", "inf", "-inf", "1e19", "1e300", "0.01", "1s", "0x10",
];
const BAD_URLS: [&str; 8] = [
    "ftp://x",
    "169.254.169.254",
    "http://",
    "http:///x",
    "http://a b",
    "http://h/?q=1",
    "http://h/#f",
    "https://user:pw@h.example",
];
const META_FLAGS: [(&str, &str); 11] = [
    ("--job-name", "TRACKER_JOB_NAME"),
    ("--project-name", "TRACKER_PROJECT_NAME"),
    ("--stage-name", "TRACKER_STAGE_NAME"),
    ("--task-name", "TRACKER_TASK_NAME"),
    ("--team", "TRACKER_TEAM"),
    ("--env", "TRACKER_ENV"),
    ("--language", "TRACKER_LANGUAGE"),
    ("--orchestrator", "TRACKER_ORCHESTRATOR"),
    ("--executor", "TRACKER_EXECUTOR"),
    ("--external-run-id", "TRACKER_EXTERNAL_RUN_ID"),
    ("--container-image", "TRACKER_CONTAINER_IMAGE"),
];

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for bad in BAD_SECONDS {
        v.push(run_flag("-i", bad, &["--interval", bad]));
        v.push(config(
            &format!("[tracker]\ninterval_secs = {}\n", toml_num(bad)),
            &["interval_secs"],
        ));
        v.push(config(
            &format!("[tracker]\nupload_interval_secs = {}\n", toml_num(bad)),
            &["upload_interval_secs"],
        ));
        v.push(env(
            "TRACKER_UPLOAD_INTERVAL",
            bad,
            2,
            &["TRACKER_UPLOAD_INTERVAL"],
        ));
        v.push(stream_env(
            "TRACKER_HTTP_TIMEOUT",
            bad,
            &["TRACKER_HTTP_TIMEOUT"],
        ));
    }
    // The tail's bound: 0 is allowed (end with the command); negative, not a
    // number, or over a day is not.
    for bad in ["-1", "abc", "nan", "inf", "86401", "1e300", "2s"] {
        v.push(run_flag("--tail-timeout", bad, &["--tail-timeout", bad]));
        v.push(env(
            "TRACKER_TAIL_TIMEOUT",
            bad,
            2,
            &["TRACKER_TAIL_TIMEOUT"],
        ));
        if bad.parse::<f64>().is_ok_and(|x| x.is_finite()) {
            v.push(config(
                &format!("[tracker]\ntail_timeout_secs = {}\n", toml_num(bad)),
                &["tail_timeout_secs"],
            ));
        }
    }
    // Limits (a bound past the host's own size names the host, so it is checked in
    // tests/tests/limits.rs rather than in this machine-independent table).
    for bad in ["0", "-1", "abc", "nan", "inf", "0.001", "1s"] {
        v.push(run_flag("--cpus", bad, &["--cpus"]));
        v.push(env("TRACKER_CPUS", bad, 2, &["TRACKER_CPUS"]));
    }
    for bad in ["0", "3", "2M", "1K", "5X", "abc", "-5M", "1e400", "G"] {
        v.push(run_flag("--memory", bad, &["--memory"]));
        v.push(env("TRACKER_MEMORY", bad, 2, &["TRACKER_MEMORY"]));
    }
    for body in [
        "[tracker]\ncpus = 0\n",
        "[tracker]\ncpus = -2.5\n",
        "[tracker]\nmemory = 2\n",
        "[tracker]\nmemory = \"5X\"\n",
        "[tracker]\nmemory = true\n",
    ] {
        let key = if body.contains("cpus") {
            "cpus"
        } else {
            "memory"
        };
        v.push(config(body, &[key]));
    }
    v.push(flag(
        &["--pid", "1", "--cpus", "1"],
        2,
        &["--cpus", "run -- CMD"],
    ));
    v.push(flag(
        &["--pid", "1", "--memory", "64M"],
        2,
        &["--memory", "run -- CMD"],
    ));
    for bad in ["0", "-1", "abc", "1.5", "99999999999", "4294967296", ""] {
        v.push(flag(&["--pid", bad], 2, &["--pid"]));
    }
    for bad in ["0", "-1", "99999999999", "\"abc\"", "1.5"] {
        let mut c = config(&format!("[job]\npid = {bad}\n"), &["pid"]);
        c.args = s(&["-c", "{cfg}"]);
        v.push(c);
    }
    v.push(flag(
        &["--pid", "999999999"],
        1,
        &["no process with id 999999999"],
    ));
    v.push(flag(
        &["run", "--pid", "1", "--", "touch", "{dir}/started"],
        2,
        &["--pid"],
    ));
    for bad in ["xml", "JSONL", ""] {
        v.push(run_flag("--format", bad, &["--format"]));
    }
    for bad in ["20", "-21", "low", "1.5"] {
        v.push(run_flag("--renice", bad, &["--renice"]));
        v.push(env("TRACKER_RENICE", bad, 2, &["TRACKER_RENICE"]));
        v.push(config(
            &format!("[tracker]\nrenice = {}\n", toml_num(bad)),
            &["renice"],
        ));
    }
    // Past what any integer type holds: said to be out of range, not "not a number".
    for bad in [
        "9223372036854775807",
        "-9223372036854775808",
        "2147483648",
        "-2147483649",
    ] {
        v.push(env(
            "TRACKER_RENICE",
            bad,
            2,
            &["TRACKER_RENICE", "out of range"],
        ));
        v.push(config(
            &format!("[tracker]\nrenice = {bad}\n"),
            &["renice", "out of range"],
        ));
    }
    for bad in ["maybe", "1", ""] {
        v.push(run_flag(
            "--aggregate-cpu-steal",
            bad,
            &["--aggregate-cpu-steal"],
        ));
    }
    for bad in ["maybe", "2"] {
        v.push(env(
            "TRACKER_AGGREGATE_CPU_STEAL",
            bad,
            2,
            &["TRACKER_AGGREGATE_CPU_STEAL"],
        ));
        v.push(env("TRACKER_QUIET", bad, 2, &["TRACKER_QUIET"]));
    }
    v.push(config(
        "[tracker]\naggregate_cpu_steal = \"no\"\n",
        &["aggregate_cpu_steal"],
    ));
    v.push(config(
        "[tracker]\nformat = \"xml\"\n",
        &["format", "'xml'"],
    ));
    for bad in ["0", "63", "4194305", "-1", "many", ""] {
        v.push(run_flag("--max-tasks", bad, &["--max-tasks"]));
    }
    for bad in ["0", "3", "5", "6", "524288", "-4", "big"] {
        v.push(run_flag("--event-ring-kib", bad, &["--event-ring-kib"]));
    }
    for bad in ["novalue", "=v", " =v", "k=a\u{1}b", "k\u{7}=v"] {
        v.push(run_flag("--tag", bad, &["--tag"]));
    }
    for (f, var) in META_FLAGS {
        v.push(run_flag(f, "a\nb", &[f, "U+000A"]));
        v.push(env(var, "a\u{1b}[31m", 2, &[var, "U+001B"]));
        let key = f.trim_start_matches("--").replace('-', "_");
        v.push(config(
            &format!("[job]\n{key} = \"a\\u0007\"\n"),
            &[&key, "U+0007"],
        ));
        v.push(config(&format!("[job]\n{key} = 5\n"), &[&key]));
    }
    for var in [
        "SENTINEL_API_URL",
        "TRACKER_S3_ENDPOINT",
        "TRACKER_METADATA_URL",
        "TRACKER_METADATA_GCP_URL",
        "TRACKER_METADATA_ALIBABA_URL",
    ] {
        for bad in BAD_URLS {
            v.push(stream_env(var, bad, &[var]));
        }
    }
    for var in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ] {
        for bad in BAD_URLS {
            v.push(env(var, bad, 2, &[var]));
        }
    }
    for bad in BAD_URLS {
        v.push(run_flag("--otlp-endpoint", bad, &["--otlp-endpoint"]));
    }
    v.push(config(
        "[tracker]\notlp_endpoint = \"localhost:4318\"\n",
        &["[tracker] otlp_endpoint", "localhost:4318"],
    ));
    // With an endpoint, so that the other OpenTelemetry variables are read; a
    // header's value (a token) is never echoed.
    for (var, bad, needles) in [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "grpc",
            &["OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"][..],
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "http/json",
            &["OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json"],
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "t0ken",
            &["OTEL_EXPORTER_OTLP_HEADERS", "no '='"],
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "=t0ken",
            &["OTEL_EXPORTER_OTLP_HEADERS", "empty key"],
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "a b=t0ken",
            &["OTEL_EXPORTER_OTLP_HEADERS", "not a header name"],
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            "k=t0ken%zz",
            &["OTEL_EXPORTER_OTLP_METRICS_HEADERS", "the value of 'k'"],
        ),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "team",
            &["OTEL_RESOURCE_ATTRIBUTES", "no '='"],
        ),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "a=%e2%28",
            &["OTEL_RESOURCE_ATTRIBUTES", "percent-encoded UTF-8"],
        ),
        (
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "10s",
            &["OTEL_EXPORTER_OTLP_TIMEOUT", "milliseconds"],
        ),
        (
            "OTEL_METRIC_EXPORT_INTERVAL",
            "0",
            &["OTEL_METRIC_EXPORT_INTERVAL", "milliseconds"],
        ),
    ] {
        let mut c = env(var, bad, 2, needles);
        c.env.push((
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            "http://127.0.0.1:9".into(),
        ));
        v.push(c);
    }
    for bad in BAD_URLS {
        let mut c = env("TRACKER_KEEPER_URL", bad, 2, &["TRACKER_KEEPER_URL"]);
        c.env.push(("TRACKER_RECOMMEND_SERVER".into(), "1".into()));
        v.push(c);
    }
    v.push(env(
        "TRACKER_STOP_WITH_PARENT",
        "always",
        2,
        &["TRACKER_STOP_WITH_PARENT", "always"],
    ));
    for (value, words) in [
        (
            "x",
            &["TRACKER_READY_FD", "'x' is not a file descriptor number"][..],
        ),
        ("1", &["TRACKER_READY_FD=1", "not a pipe of its own"][..]),
        ("987", &["TRACKER_READY_FD=987", "fd 987 is not open"][..]),
    ] {
        v.push(env("TRACKER_READY_FD", value, 2, words));
    }
    v.push(env(
        "TRACKER_ROOT_CHILDREN_FD",
        "x",
        2,
        &[
            "TRACKER_ROOT_CHILDREN_FD",
            "'x' is not a file descriptor number",
        ],
    ));
    // Only an attached root tells the tracker anything of itself.
    v.push(env(
        "TRACKER_ROOT_CHILDREN_FD",
        "5",
        2,
        &[
            "TRACKER_ROOT_CHILDREN_FD=5",
            "only a root the tracker attached to",
        ],
    ));
    // The ready line closes its pipe: one number for both would then name
    // whatever is opened next.
    let mut c = env(
        "TRACKER_READY_FD",
        "5",
        2,
        &[
            "TRACKER_READY_FD and TRACKER_ROOT_CHILDREN_FD are both fd 5",
            "a pipe of its own",
        ],
    );
    c.input = "TRACKER_READY_FD=\"5\" TRACKER_ROOT_CHILDREN_FD=\"5\"".into();
    c.env.push(("TRACKER_ROOT_CHILDREN_FD".into(), "5".into()));
    v.push(c);
    for bad in ["x", "0", "-3", "4294967295"] {
        v.push(env(
            "TRACKER_PARENT_PID",
            bad,
            2,
            &["TRACKER_PARENT_PID", "is not a process id"],
        ));
    }
    v.push(env(
        "TRACKER_RECOMMEND_SERVER",
        "perhaps",
        2,
        &["TRACKER_RECOMMEND_SERVER", "perhaps"],
    ));
    v.push(config(
        "[tracker]\nrecommend_server = \"yes\"\n",
        &["recommend_server"],
    ));
    v.push(flag(
        &[
            "run",
            "--report",
            "{dir}/no/such/r.html",
            "--",
            "touch",
            "{dir}/started",
        ],
        1,
        &["--report", "does not exist"],
    ));
    v.push(flag(
        &["run", "--report", "{dir}", "--", "touch", "{dir}/started"],
        1,
        &["--report", "is a directory"],
    ));
    v.push(flag(
        &[
            "run",
            "--report",
            "{file}",
            "-o",
            "{file}",
            "--",
            "touch",
            "{dir}/started",
        ],
        2,
        &["--report", "-o", "same file"],
    ));
    v.push(flag(&["report"], 2, &["FILE"]));
    v.push(flag(
        &["report", "{file}", "-o", "{file}"],
        2,
        &["-o", "input"],
    ));
    v.push(flag(
        &["report", "{file}", "--status", "done"],
        2,
        &["--status", "done"],
    ));
    v.push(flag(
        &["report", "{file}", "--hints", "shell"],
        2,
        &["--hints", "shell"],
    ));
    v.push(flag(
        &["report", "{file}", "--title", " "],
        2,
        &["--title", "empty"],
    ));
    v.push(flag(&["report", "{dir}"], 1, &["is a directory"]));
    v.push(flag(
        &["report", "{dir}/missing.jsonl"],
        1,
        &["missing.jsonl"],
    ));
    v.push(flag(
        &["report", "{file}", "-o", "{dir}/no/r.html"],
        1,
        &["-o", "does not exist"],
    ));
    for var in ["TRACKER_DISCOVER", "TRACKER_SHARE_IDENTITY"] {
        for bad in ["2", "maybe", "tru"] {
            v.push(env(var, bad, 2, &[var, bad]));
        }
    }
    for bad in ["-1", "lots", "1.5", "18446744073709551616"] {
        v.push(stream_env(
            "TRACKER_UPLOAD_MEMORY_LIMIT",
            bad,
            &["TRACKER_UPLOAD_MEMORY_LIMIT"],
        ));
    }
    for (bad, why) in [
        ("{file}", "is not a directory"),
        ("{dir}/missing", "No such file"),
        ("{link}", "symbolic link"),
        // A directory that exists but takes no file: proven by a real write.
        ("/proc", "no file can be made there"),
        ("/sys", "TRACKER_SPOOL_DIR"),
    ] {
        v.push(stream_env(
            "TRACKER_SPOOL_DIR",
            bad,
            &["TRACKER_SPOOL_DIR", why],
        ));
    }
    for bad in ["sec ret", "tab\tbed"] {
        let mut c = env("SENTINEL_API_TOKEN", bad, 2, &["SENTINEL_API_TOKEN"]);
        c.input = "SENTINEL_API_TOKEN=<with a space or control character>".into();
        v.push(c);
    }
    for (var, bad) in [
        ("SUDO_UID", "abc"),
        ("SUDO_UID", "-1"),
        ("SUDO_GID", "x"),
        ("SUDO_UID", "99999999999"),
        ("SUDO_UID", "4294967295"),
        ("SUDO_GID", "4294967295"),
    ] {
        let mut c = env(var, bad, 2, &[var]);
        if var == "SUDO_GID" {
            c.env.push(("SUDO_UID".into(), "65534".into()));
        }
        v.push(c);
    }
    // Files: where they cannot be made (1), and two flags on one file (2).
    for f in ["-o", "--summary", "--events"] {
        v.push(flag(
            &["run", f, "{dir}/missing/x", "--", "touch", "{dir}/started"],
            1,
            &["{dir}/missing/x"],
        ));
        v.push(flag(
            &["run", f, "{dir}", "--", "touch", "{dir}/started"],
            1,
            &["{dir}"],
        ));
    }
    for (a, b) in [
        ("-o", "--summary"),
        ("-o", "--events"),
        ("--summary", "--events"),
    ] {
        v.push(flag(
            &[
                "run",
                a,
                "{dir}/same",
                b,
                "{dir}/same",
                "--",
                "touch",
                "{dir}/started",
            ],
            2,
            &[a, b, "same file"],
        ));
        v.push(flag(
            &[
                "run",
                a,
                "{file}",
                b,
                "{dir}/hard",
                "--",
                "touch",
                "{dir}/started",
            ],
            2,
            &[a, b, "same file"],
        ));
    }
    v.push(flag(
        &[
            "run",
            "-o",
            "{dir}/./same",
            "--summary",
            "{dir}/same",
            "--",
            "touch",
            "{dir}/started",
        ],
        2,
        &["-o", "--summary", "same file"],
    ));
    v.push(flag(
        &[
            "run",
            "--no-ebpf",
            "--events",
            "{dir}/ev",
            "--",
            "touch",
            "{dir}/started",
        ],
        2,
        &["--events", "--no-ebpf"],
    ));
    // Files that are not regular files, and inputs without end: refused at once,
    // never opened so that they block, never read without bound.
    // Someone else's FIFO at an output: never opened so that it blocks, and it
    // cannot keep the command from running either (the output goes to a private
    // file under TMPDIR, named in the line).
    for f in ["-o", "--summary", "--events", "--report"] {
        let mut c = flag(
            &["run", "-q", f, "{fifo}", "--", "touch", "{dir}/started"],
            0,
            &[
                "{fifo}",
                "FIFO",
                "{dir}/resource-tracker-kept-",
                "the command runs",
            ],
        );
        c.env.push(("TMPDIR".into(), "{dir}".into()));
        c.input = format!("TMPDIR={{dir}} {}", c.input);
        c.starts = true;
        v.push(c);
    }
    for (c, needle) in [
        ("{fifo}", "FIFO"),
        ("{dir}", "directory"),
        ("{link}", "directory"),
        ("/dev/zero", "longer than"),
        ("/dev/full", "longer than"),
        ("/dev/urandom", "longer than"),
    ] {
        v.push(flag(
            &["run", "-c", c, "--", "touch", "{dir}/started"],
            2,
            &["config file", c, needle],
        ));
    }
    v.push(flag(&["report", "{fifo}"], 1, &["{fifo}", "FIFO"]));
    v.push(flag(
        &["report", "-o", "{fifo}", "{file}"],
        1,
        &["{fifo}", "FIFO"],
    ));
    v.push(flag(&["node", "-o", "{fifo}"], 1, &["{fifo}", "FIFO"]));
    // The config file is a file too: no output may be it, by any name.
    for f in ["-o", "--summary", "--events", "--report"] {
        let mut c = config("[tracker]\n", &[f, "the config file", "same file"]);
        c.input = format!("run -c {{cfg}} {f} {{cfg}} -- touch {{dir}}/started");
        c.args = s(&[
            "run",
            "-c",
            "{cfg}",
            f,
            "{cfg}",
            "--",
            "touch",
            "{dir}/started",
        ]);
        v.push(c);
    }
    let mut c = config(
        "[tracker]\noutput = \"{cfg}\"\n",
        &["-o", "the config file", "same file"],
    );
    c.args = s(&["run", "-c", "{cfg}", "--", "touch", "{dir}/started"]);
    v.push(c);
    // Two names of one file yet to be made: through a link to its directory, or a
    // link to it that does not lead anywhere yet.
    for (a, b) in [
        ("{link}/x", "{dir}/x"),
        ("{dangling}", "{dir}/target"),
        ("{link}/hard", "{file}"),
    ] {
        for (fa, fb) in [("-o", "--summary"), ("--events", "--report")] {
            v.push(flag(
                &["run", fa, a, fb, b, "--", "touch", "{dir}/started"],
                2,
                &[fa, fb, "same file"],
            ));
        }
    }
    // The command line itself.
    v.push(flag(&["run", "--"], 2, &["<CMD>"]));
    v.push(flag(&["run"], 2, &["<CMD>"]));
    v.push(flag(&["--bogus-flag"], 2, &["--bogus-flag"]));
    v.push(flag(&["run", "-z", "--", "true"], 2, &["-z"]));
    // Not a subcommand: a command, as with a shell.
    v.push(flag(&["stopp"], 127, &["stopp: command not found"]));
    v.push(flag(&["-i"], 2, &["--interval"]));
    v.push(flag(&["-c"], 2, &["--config"]));
    // The config file itself (one that does not exist is only a warning, as the
    // usage guide has it: tests/tests/bad_input.rs).
    v.push(flag(&["-c", "{dir}"], 2, &["{dir}"]));
    v.push(config("[job\nname = 1\n", &["line 1"]));
    v.push(config(
        "[job]\nname = \"x\"\npid = = 3\n",
        &["line 3", "column 7"],
    ));
    v.push(config("[job]\ntags = \"a\"\n", &["tags"]));
    v.push(config("[job]\ntags = { k = 1 }\n", &["tags"]));
    v.push(config("[job]\ntags = { k = \"a\\u0000\" }\n", &["tags.k"]));
    v.push(config("job = 3\n", &["job"]));
    v.push(config("[tracker]\nquiet = \"yes\"\n", &["quiet"]));
    v.push(config("[tracker]\ndiscover = 1\n", &["discover"]));
    v.push(config("[tracker]\noutput = 5\n", &["output"]));
    v.push(config("\u{feff}\u{0}", &["{cfg}"]));
    v
}

/// A value as TOML would take it: numbers bare, anything else quoted.
fn toml_num(v: &str) -> String {
    match v {
        "nan" | "inf" | "-inf" => v.to_string(),
        _ if v.parse::<f64>().is_ok() && !v.starts_with("0x") => v.to_string(),
        _ => format!("{v:?}"),
    }
}

struct Scr {
    s: Scratch,
    dir: PathBuf,
    file: PathBuf,
    link: PathBuf,
    cfg: PathBuf,
    fifo: PathBuf,
    dangling: PathBuf,
}

impl Scr {
    fn new(i: usize) -> Scr {
        let s = Scratch::new(&format!("bad{i}"));
        let dir = s.path("d");
        std::fs::create_dir(&dir).expect("dir");
        let file = s.path("f");
        std::fs::write(&file, "").expect("file");
        std::fs::hard_link(&file, dir.join("hard")).expect("hard link");
        let link = s.path("l");
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        let cfg = s.path("c.toml");
        let fifo = s.path("p");
        let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(made.success(), "mkfifo");
        // A link to a file not yet made: `{dir}/target`.
        let dangling = s.path("dl");
        std::os::unix::fs::symlink(dir.join("target"), &dangling).expect("symlink");
        Scr {
            s,
            dir,
            file,
            link,
            cfg,
            fifo,
            dangling,
        }
    }

    fn fill(&self, t: &str) -> String {
        t.replace("{dir}", &show(&self.dir))
            .replace("{file}", &show(&self.file))
            .replace("{link}", &show(&self.link))
            .replace("{cfg}", &show(&self.cfg))
            .replace("{fifo}", &show(&self.fifo))
            .replace("{dangling}", &show(&self.dangling))
    }

    /// The scratch paths back to their names, for the table.
    fn unfill(&self, t: &str) -> String {
        t.replace(&show(&self.cfg), "{cfg}")
            .replace(&show(&self.fifo), "{fifo}")
            .replace(&show(&self.dangling), "{dangling}")
            .replace(&show(&self.dir), "{dir}")
            .replace(&show(&self.file), "{file}")
            .replace(&show(&self.link), "{link}")
    }
}

/// A private directory's random suffix as `XXXXXX`, so the table stays the same.
fn kept_masked(t: &str) -> String {
    const KEPT: &str = "resource-tracker-kept-";
    let mut out = String::new();
    let mut rest = t;
    while let Some(i) = rest.find(KEPT) {
        let (head, tail) = rest.split_at(i + KEPT.len());
        out.push_str(head);
        let n = tail
            .char_indices()
            .take_while(|(_, c)| c.is_ascii_alphanumeric())
            .count();
        out.push_str(&"X".repeat(n));
        rest = &tail[n..];
    }
    out.push_str(rest);
    out
}

fn show(p: &Path) -> String {
    p.to_str().expect("utf-8 scratch path").to_string()
}

/// Runs one case; its row of the table, or what went wrong.
fn check(i: usize, c: &Case) -> Result<String, String> {
    let scr = Scr::new(i);
    if let Some(body) = &c.config {
        std::fs::write(&scr.cfg, scr.fill(body)).expect("config");
    }
    let mut cmd = Command::new(tracker());
    e2e::clean_env(&mut cmd);
    cmd.env_remove("SUDO_UID").env_remove("SUDO_GID");
    cmd.current_dir(&scr.s.0);
    cmd.args(c.args.iter().map(|a| scr.fill(a)));
    for (k, v) in &c.env {
        cmd.env(k, scr.fill(v));
    }
    let what = format!("case {i} `{}`", c.input);
    let o = bounded(&mut cmd, &what)?;
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    if err.contains("panicked") {
        return Err(format!("{what}: panicked: {err}"));
    }
    if o.status.code() != Some(c.code) {
        return Err(format!(
            "{what}: exit {:?}, not {}: {err}",
            o.status.code(),
            c.code
        ));
    }
    let line = err.trim_end();
    if line.lines().count() != 1 || !line.starts_with("resource-tracker: ") {
        return Err(format!("{what}: not one line: {err}"));
    }
    for n in &c.needles {
        let n = scr.fill(n);
        if !line.contains(&n) {
            return Err(format!("{what}: {n:?} not in {line}"));
        }
    }
    if scr.dir.join("started").exists() != c.starts {
        return Err(format!(
            "{what}: the command {}",
            if c.starts {
                "did not run"
            } else {
                "was started"
            }
        ));
    }
    let msg = kept_masked(&scr.unfill(line.trim_start_matches("resource-tracker: ")));
    Ok(format!(
        "| `{}` | {} | {} |",
        cell(&c.input),
        cell(&msg),
        c.code
    ))
}

/// Runs `cmd` (stdin closed); a run past 20 s is a hang: killed, and an error.
fn bounded(cmd: &mut Command, what: &str) -> Result<std::process::Output, String> {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let t0 = std::time::Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: still running after 20 s (a hang)"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().map_err(|e| e.to_string())
}

/// Text safe in a Markdown table cell.
fn cell(t: &str) -> String {
    t.escape_debug()
        .to_string()
        .replace("\\\"", "\"")
        .replace("\\'", "'")
        .replace('|', "\\|")
        .replace('`', "'")
}

#[test]
fn every_bad_input_is_one_line_and_its_exit_code() {
    let cases = cases();
    assert!(cases.len() >= 200, "{} cases", cases.len());
    // Independent runs of a short-lived binary: a few at a time.
    let results: Vec<Result<String, String>> = std::thread::scope(|sc| {
        let chunks: Vec<_> = cases.chunks(cases.len().div_ceil(4)).collect();
        let mut offset = 0;
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|ch| {
                let start = offset;
                offset += ch.len();
                sc.spawn(move || {
                    ch.iter()
                        .enumerate()
                        .map(|(j, c)| check(start + j, c))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a checking thread"))
            .collect()
    });
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} cases:\n{}",
        failed.len(),
        cases.len(),
        failed
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let rows: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let doc = format!(
        "# Bad input\n\n\
         Generated by `tests/tests/bad_input_table.rs` from what the binary says \
         (`TRACKER_BLESS=1 cargo test -p tracker-tests --test bad_input_table` \
         rewrites it; the test fails while the two differ). {} cases, each one line \
         on stderr, none a panic, and in none the command started but where someone \
         else's file stands at an output (there the output goes to a private file \
         the line names, the command runs and its exit code is the tracker's). Exit \
         code 2: the input is wrong (nothing was started); 1: a file the user named \
         cannot be made; 127: no such command, as with a shell. `{{dir}}`, `{{file}}`, `{{link}}`, `{{cfg}}`, `{{fifo}}` and \
         `{{dangling}}` stand for a scratch directory, a regular file, a link to the \
         directory, the config file, a FIFO no one has open and a link to \
         `{{dir}}/target`, which does not exist. No case may run past 20 s.\n\n\
         | Input | Message | Exit |\n|---|---|---|\n{}\n",
        rows.len(),
        rows.iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bad-input.md");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    // The sections after the table ("Degraded figures") are written by hand and
    // kept as they are; no table row starts a line with `## `.
    let tail = have.find("\n## ").map_or("", |i| &have[i..]);
    if std::env::var_os("TRACKER_BLESS").is_some() {
        std::fs::write(&path, format!("{doc}{tail}")).expect("write docs/bad-input.md");
        return;
    }
    assert!(
        have[..have.len() - tail.len()] == doc,
        "docs/bad-input.md is not in step with the binary: run \
         TRACKER_BLESS=1 cargo test -p tracker-tests --test bad_input_table"
    );
}
