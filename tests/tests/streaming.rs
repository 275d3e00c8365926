//! Streaming to Sentinel against real parts: moto (S3 with SigV4 and STS temporary
//! credentials) behind the mock Sentinel API and its fault-injecting S3 relay.
//! The claim under test: the objects in the bucket decompress to CSVs whose rows are
//! exactly the rows written locally, in order, none missing, none twice — whatever
//! fails on the way — and the token never shows.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracker_tests::{
    closed_url,
    e2e::{clean_env, have, is_root, require, Bg},
    read_json,
    sentinel::{Creds, Issue, MockSentinel, Moto, Scenario, TOKEN},
    tracker, Scratch,
};

fn mock(sc: &Scenario) -> MockSentinel {
    MockSentinel::start_bin(Path::new(env!("CARGO_BIN_EXE_mock-sentinel")), sc)
}

struct Streamed {
    status: ExitStatus,
    stderr: String,
    /// The local CSV, as written.
    local: String,
    summary: Value,
    summary_text: String,
    dir: PathBuf,
}

impl Streamed {
    fn rows(&self) -> Vec<String> {
        self.local.lines().skip(1).map(str::to_string).collect()
    }
    fn header(&self) -> &str {
        self.local.lines().next().unwrap_or("")
    }
}

/// The tracker command for a streamed run: CSV into `local.csv`, summary into
/// `summary.json`, procfs backend (streaming does not depend on it), every
/// metadata service pointed at a closed port.
fn command(dir: &Scratch, api: &str, s3: &str, upload: &str, cmd: &[&str]) -> Command {
    let mut c = Command::new(tracker());
    clean_env(&mut c);
    let dead = closed_url();
    c.env("SENTINEL_API_TOKEN", TOKEN)
        .env("SENTINEL_API_URL", api)
        .env("TRACKER_S3_ENDPOINT", s3)
        .env("TRACKER_UPLOAD_INTERVAL", upload)
        .env("TRACKER_HTTP_TIMEOUT", "1")
        .env("TRACKER_SPOOL_DIR", &dir.0)
        .env("TRACKER_METADATA_URL", &dead)
        .env("TRACKER_METADATA_GCP_URL", &dead)
        .env("TRACKER_METADATA_ALIBABA_URL", &dead)
        .args(["run", "--no-ebpf", "-i", "0.2", "-f", "csv", "-o"])
        .arg(dir.path("local.csv"))
        .arg("--summary")
        .arg(dir.path("summary.json"))
        .arg("--")
        .args(cmd)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn collect(dir: &Scratch, status: ExitStatus, stderr: String) -> Streamed {
    let local = std::fs::read_to_string(dir.path("local.csv")).expect("local.csv");
    let summary_text = std::fs::read_to_string(dir.path("summary.json")).unwrap_or_default();
    let summary = read_json(&dir.path("summary.json"));
    let r = Streamed {
        status,
        stderr,
        local,
        summary,
        summary_text,
        dir: dir.0.clone(),
    };
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert!(!r.rows().is_empty(), "no local rows:\n{}", r.local);
    r
}

fn run_streamed(dir: &Scratch, m: &MockSentinel, upload: &str, cmd: &[&str]) -> Streamed {
    run_with(dir, command(dir, &m.api_url(), &m.s3_url(), upload, cmd))
}

fn run_with(dir: &Scratch, mut c: Command) -> Streamed {
    let o = c.output().expect("run the tracker");
    collect(
        dir,
        o.status,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The token appears in no output the tracker made.
fn assert_no_token(r: &Streamed) {
    for (what, text) in [
        ("stderr", &r.stderr),
        ("local CSV", &r.local),
        ("summary", &r.summary_text),
    ] {
        assert!(
            !text.contains(TOKEN),
            "the token appears in the {what}:\n{text}"
        );
    }
}

/// Rows of the batch objects, in key order, after checking every object stands alone.
fn bucket_rows(moto: &Moto, r: &Streamed) -> (Vec<String>, Vec<String>) {
    let objects = moto.dump(&moto.bucket, "runs/");
    assert!(
        !objects.is_empty(),
        "no object in the bucket; stderr:\n{}",
        r.stderr
    );
    let mut rows = Vec::new();
    let mut uris = Vec::new();
    for o in &objects {
        let text = o
            .text
            .as_ref()
            .unwrap_or_else(|e| panic!("{} is not a gzip CSV: {e}", o.key));
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(r.header()), "{}: header line", o.key);
        let n = rows.len();
        rows.extend(lines.map(str::to_string));
        assert!(rows.len() > n, "{}: an object without rows", o.key);
        uris.push(format!("s3://{}/{}", moto.bucket, o.key));
    }
    (rows, uris)
}

/// The bucket holds exactly the local rows, and `finish` named exactly its objects.
fn assert_lossless(moto: &Moto, m: &MockSentinel, r: &Streamed) -> usize {
    let (rows, uris) = bucket_rows(moto, r);
    let local = r.rows();
    let puts: Vec<String> = m
        .records_of("s3_put")
        .iter()
        .map(|p| format!("{} {} {}", p["path"], p["status"], p["action"]))
        .collect();
    assert_eq!(
        rows.len(),
        local.len(),
        "bucket rows vs local rows; streaming {}; PUTs {puts:#?}; stderr:\n{}",
        r.summary["streaming"],
        r.stderr
    );
    assert_eq!(rows, local, "bucket rows differ from the local CSV");
    let fin: Vec<Value> = m
        .records_of("finish")
        .into_iter()
        .filter(|f| f["status"] == 200)
        .collect();
    assert_eq!(fin.len(), 1, "one accepted finish: {fin:?}");
    let body = &fin[0]["body"];
    assert_eq!(body["data_source"], "s3", "{body}");
    let sent: Vec<String> = body["data_uris"]
        .as_array()
        .expect("data_uris")
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(sent, uris, "finish must list every object, in order");
    let s = &r.summary["streaming"];
    assert_eq!(s["finished"], true, "{s}");
    assert_eq!(s["rows"].as_u64(), Some(local.len() as u64), "{s}");
    assert_eq!(s["rows_uploaded"].as_u64(), Some(local.len() as u64), "{s}");
    assert_no_token(r);
    uris.len()
}

#[test]
fn long_run_uploads_several_batches_that_match_the_local_csv() {
    let Some(moto) = Moto::start("stream-long", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto));
    let dir = Scratch::new("stream-long");
    let mut c = command(&dir, &m.api_url(), &m.s3_url(), "1", &["sleep", "4.5"]);
    // Debug logging too must not show the token.
    c.env("RUST_LOG", "debug");
    let r = run_with(&dir, c);
    assert!(r.status.success(), "{:?}\n{}", r.status, r.stderr);
    let n = assert_lossless(&moto, &m, &r);
    assert!(n >= 3, "{n} batches in a 4.5 s run at 1 s");
    let reg = &m.records_of("register")[0];
    assert_eq!(reg["status"], 200, "{reg}");
    assert_eq!(reg["body"]["command"], "[\"sleep\",\"4.5\"]");
    assert!(reg["body"].get("pid").is_none());
    assert!(
        reg["body"].get("host_hostname").is_none(),
        "identifying field without opt-in"
    );
    let fin = &m.records_of("finish")[0]["body"];
    assert_eq!(
        (fin["exit_code"].as_i64(), fin["run_status"].as_str()),
        (Some(0), Some("finished"))
    );
    // Every request carried the token as a bearer token.
    for rec in m
        .records()
        .iter()
        .filter(|r| r["kind"] == "register" || r["kind"] == "finish")
    {
        assert_eq!(rec["headers"]["authorization"], format!("Bearer {TOKEN}"));
    }
}

#[test]
fn short_run_goes_inline() {
    let Some(moto) = Moto::start("stream-short", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto));
    let dir = Scratch::new("stream-short");
    let mut c = command(
        &dir,
        &m.api_url(),
        &m.s3_url(),
        "60",
        &["sh", "-c", "sleep 0.5; exit 3"],
    );
    c.env("TRACKER_SHARE_IDENTITY", "1");
    let r = run_with(&dir, c);
    assert_eq!(r.status.code(), Some(3), "{}", r.stderr);
    assert!(
        m.records_of("s3_put").is_empty(),
        "a short run uploads nothing"
    );
    let fin = m.records_of("finish");
    assert_eq!(fin.len(), 1, "{fin:?}");
    let b = &fin[0]["body"];
    assert_eq!(fin[0]["status"], 200, "{}", fin[0]);
    assert_eq!(b["data_source"], "inline");
    assert_eq!(b["exit_code"], 3);
    assert_eq!(b["run_status"], "failed");
    assert_eq!(
        b["data_csv"].as_str(),
        Some(r.local.as_str()),
        "inline CSV = local CSV"
    );
    assert!(
        b.get("data_uris").is_none() && b.get("run_id").is_none(),
        "{b}"
    );
    assert_eq!(r.summary["streaming"]["data_source"], "inline");
    assert_no_token(&r);
    // Opted in: the identifying fields are there.
    let reg = &m.records_of("register")[0]["body"];
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert_eq!(reg["host_hostname"].as_str(), Some(host.trim()), "{reg}");
    assert!(
        reg["host_id"].as_str().is_some_and(|s| !s.is_empty()),
        "{reg}"
    );
}

#[test]
fn upload_failures_for_several_intervals_lose_nothing() {
    let Some(moto) = Moto::start("stream-faults", 2) else {
        return;
    };
    // 5xx, a dropped connection, an answer past the 1 s timeout (the PUT still
    // lands later: the retry must overwrite it, not duplicate it), an S3 error body.
    let sc = Scenario::new(&moto).fault(
        "s3_put",
        &[
            "status:503",
            "status:500",
            "close",
            "sleep:2500",
            "status:400:InvalidArgument",
        ],
    );
    let m = mock(&sc);
    let dir = Scratch::new("stream-faults");
    let r = run_streamed(&dir, &m, "1", &["sleep", "9"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_lossless(&moto, &m, &r);
    let puts = m.records_of("s3_put");
    let failed = puts.iter().filter(|p| p["status"] != 200).count();
    assert!(failed >= 4, "{failed} failed PUTs: {puts:?}");
    assert!(
        r.summary["streaming"]["upload_failures"].as_u64() >= Some(5),
        "{}",
        r.summary["streaming"]
    );
    // One warning when the failures start, one when they end; the reasons named.
    let warns: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("Sentinel"))
        .collect();
    assert!(
        warns.len() <= 7,
        "warnings should not repeat per failure:\n{}",
        r.stderr
    );
    // Each distinct reason is named once, the S3 error body's code included.
    for reason in ["503", "500", "timed out", "InvalidArgument"] {
        assert!(r.stderr.contains(reason), "{reason}: {}", r.stderr);
    }
    assert!(
        r.stderr.contains("working again"),
        "recovery said: {}",
        r.stderr
    );
    // Several batches waited and went up in order after the failures.
    assert!(r.summary["streaming"]["batches_uploaded"].as_u64() >= Some(3));
}

/// Every PUT fails: `finish` must not claim S3 data it cannot list (the API
/// refuses `s3` without URIs); the rows, which fit, go inline, all of them.
#[test]
fn nothing_reached_s3_so_finish_carries_the_rows_inline() {
    let Some(moto) = Moto::start("stream-nos3", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto).fault("s3_put", &["status:503"; 60]));
    let dir = Scratch::new("stream-nos3");
    let r = run_streamed(&dir, &m, "1", &["sleep", "2.5"]);
    assert!(r.status.success(), "{}", r.stderr);
    let puts = m.records_of("s3_put");
    assert!(
        !puts.is_empty() && puts.iter().all(|p| p["status"] == 503),
        "{puts:?}"
    );
    let fin = m.records_of("finish");
    assert_eq!(fin.len(), 1, "{fin:?}");
    assert_eq!(fin[0]["status"], 200, "{}", fin[0]);
    let b = &fin[0]["body"];
    assert_eq!(b["data_source"], "inline", "{b}");
    assert_eq!(b["run_status"], "finished", "{b}");
    assert_eq!(b["data_csv"].as_str(), Some(r.local.as_str()));
    let st = &r.summary["streaming"];
    assert_eq!(
        (&st["finished"], &st["data_source"], &st["partial"]),
        (
            &Value::Bool(true),
            &Value::from("inline"),
            &Value::Bool(false)
        ),
        "{st}"
    );
    assert_eq!(st["rows_uploaded"].as_u64(), Some(r.rows().len() as u64));
}

/// A registration answered after the upload time-out: waited for, not sent again
/// (each try could leave a run on the server that is never finished). The run
/// carries a client-made external_run_id.
#[test]
fn a_late_registration_is_waited_for_not_repeated() {
    let Some(moto) = Moto::start("stream-latereg", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto).fault("register", &["sleep:1800"]));
    let dir = Scratch::new("stream-latereg");
    let r = run_streamed(&dir, &m, "1", &["sleep", "3"]);
    assert!(r.status.success(), "{}", r.stderr);
    let regs = m.records_of("register");
    assert_eq!(regs.len(), 1, "{regs:?}");
    let id = regs[0]["body"]["external_run_id"].as_str().unwrap_or("");
    assert!(
        id.starts_with("rt-") && id.len() > 20,
        "{}",
        regs[0]["body"]
    );
    let fin = m.records_of("finish");
    assert_eq!(fin.len(), 1, "{fin:?}");
    assert_eq!(fin[0]["status"], 200, "{}", fin[0]);
    assert_lossless(&moto, &m, &r);
    assert_eq!(r.summary["streaming"]["registrations_timed_out"], 0);
}

#[test]
fn memory_limit_spools_batches_and_they_come_back_in_order() {
    let Some(moto) = Moto::start("stream-spool", 2) else {
        return;
    };
    // S3 down for ~4 intervals with a 1.5 KB memory limit: batches pile up and
    // must go through the spool file.
    let m = mock(&Scenario::new(&moto).fault("s3_put", &["status:503"; 4]));
    let dir = Scratch::new("stream-spool");
    let mut c = command(&dir, &m.api_url(), &m.s3_url(), "1", &["sleep", "7"]);
    c.env("TRACKER_UPLOAD_MEMORY_LIMIT", "1500");
    let r = run_with(&dir, c);
    assert!(r.status.success(), "{}", r.stderr);
    assert_lossless(&moto, &m, &r);
    let spooled = r.summary["streaming"]["spooled_batches"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        spooled >= 2,
        "spooled {spooled}: {}",
        r.summary["streaming"]
    );
    // The spool file is unlinked: nothing is left in the spool directory.
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .expect("dir")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("resource-tracker-")
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn s3_forbidden_until_the_credentials_are_refreshed() {
    let Some(moto) = Moto::start("stream-403", 2) else {
        return;
    };
    let mut sc = Scenario::new(&moto);
    // The first issuance carries a wrong secret: S3 answers 403 SignatureDoesNotMatch.
    let good = sc.credentials[0].clone();
    sc.credentials.push(Creds {
        secret_key: format!("{}x", good.secret_key),
        ..good
    });
    let bad = sc.credentials.len() - 1;
    let sc = sc
        .issue(Issue::cred(bad, 3600.0))
        .issue(Issue::cred(1, 3600.0));
    let m = mock(&sc);
    let dir = Scratch::new("stream-403");
    let r = run_streamed(&dir, &m, "1", &["sleep", "3"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_lossless(&moto, &m, &r);
    let recs = m.records();
    let first_403 = recs
        .iter()
        .position(|x| x["kind"] == "s3_put" && x["status"] == 403)
        .expect("a 403 from S3 with the bad credentials");
    let refresh = recs
        .iter()
        .position(|x| x["kind"] == "refresh" && x["status"] == 200)
        .expect("a refresh");
    assert!(refresh > first_403, "refresh after the 403");
    assert!(
        recs[refresh..]
            .iter()
            .any(|x| x["kind"] == "s3_put" && x["status"] == 200),
        "uploads succeed after the refresh"
    );
    assert!(recs[..refresh]
        .iter()
        .all(|x| x["kind"] != "s3_put" || x["status"] != 200));
}

#[test]
fn refresh_failing_once_keeps_the_old_credentials() {
    let Some(moto) = Moto::start("stream-refresh", 2) else {
        return;
    };
    // 200 s left at registration: under the 300 s margin, so a refresh is due at
    // once; the first one fails, the old credentials (still valid) carry on.
    let sc = Scenario::new(&moto)
        .issue(Issue::cred(0, 200.0))
        .issue(Issue::cred(1, 3600.0))
        .fault("refresh", &["status:500"]);
    let m = mock(&sc);
    let dir = Scratch::new("stream-refresh");
    let r = run_streamed(&dir, &m, "1", &["sleep", "3.5"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_lossless(&moto, &m, &r);
    let refreshes = m.records_of("refresh");
    let st: Vec<&Value> = refreshes.iter().map(|x| &x["status"]).collect();
    assert!(refreshes.len() >= 2, "{st:?}");
    assert_eq!(refreshes[0]["status"], 500);
    assert_eq!(refreshes[1]["status"], 200);
    assert_eq!(
        refreshes.len(),
        2,
        "no refresh once the new credentials last: {st:?}"
    );
    assert_eq!(r.summary["streaming"]["credential_refreshes"], 1);
    // The upload right after the failed refresh used the first credentials.
    let puts = m.records_of("s3_put");
    let ak = |p: &Value| {
        p["headers"]["authorization"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(
        ak(&puts[0]).contains(&moto.credentials[0].access_key),
        "{}",
        puts[0]
    );
    assert!(ak(puts.last().expect("puts")).contains(&moto.credentials[1].access_key));
}

/// A refresh that fails at every batch while the credentials still hold: said once
/// for its reason, not once a second, and nothing is lost.
#[test]
fn refresh_failing_every_time_is_said_once() {
    let Some(moto) = Moto::start("stream-refresh-all", 1) else {
        return;
    };
    let sc = Scenario::new(&moto)
        .issue(Issue::cred(0, 200.0))
        .fault("refresh", &["status:500"; 30]);
    let m = mock(&sc);
    let dir = Scratch::new("stream-refresh-all");
    let r = run_streamed(&dir, &m, "1", &["sleep", "5"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_lossless(&moto, &m, &r);
    let tries = m.records_of("refresh").len();
    assert!(tries >= 3, "the refresh was tried at each batch: {tries}");
    let said = r
        .stderr
        .lines()
        .filter(|l| l.contains("refreshing the upload credentials failed"))
        .count();
    assert_eq!(said, 1, "{tries} failed refreshes:\n{}", r.stderr);
}

/// S3 stores every PUT but answers only after the client gave up (slower than the
/// request time-out): the tracker finds each object stored (a HEAD of its key) and
/// lists it; no row goes inline as well, none is lost.
#[test]
fn puts_that_time_out_but_land_are_listed_not_sent_again() {
    let Some(moto) = Moto::start("stream-lands", 1) else {
        return;
    };
    let m = mock(&Scenario::new(&moto).fault("s3_put", &["sleep:1500"; 80]));
    let dir = Scratch::new("stream-lands");
    let r = run_streamed(&dir, &m, "1", &["sleep", "3"]);
    assert!(r.status.success(), "{}", r.stderr);
    let n = assert_lossless(&moto, &m, &r);
    eprintln!("{n} objects, each PUT answered after the time-out");
}

/// An API that takes the connection and never answers: the tracker's exit waits
/// no longer than the end's budget (30 s) and one request time-out, however long
/// the registration may take (three time-outs); no second registration is tried
/// after the command ended, and every row is kept on disk.
#[test]
fn a_hanging_api_delays_the_exit_by_the_end_budget_at_most() {
    let Some(moto) = Moto::start("stream-hang", 1) else {
        return;
    };
    let m = mock(&Scenario::new(&moto).fault("register", &["sleep:200000", "sleep:200000"]));
    let dir = Scratch::new("stream-hang");
    let mut c = command(&dir, &m.api_url(), &m.s3_url(), "1", &["sleep", "1"]);
    c.env("TRACKER_HTTP_TIMEOUT", "20");
    let t0 = Instant::now();
    let r = run_with(&dir, c);
    let wall = t0.elapsed().as_secs_f64();
    assert!(r.status.success(), "{}", r.stderr);
    assert!(
        wall <= 1.0 + 30.0 + 20.0 + 3.0,
        "the exit waited {wall:.1} s:\n{}",
        r.stderr
    );
    // (The mock records a request when it answers, which it never does here: the
    // time bound is what shows that no second registration was waited for.)
    assert!(
        r.stderr
            .contains("the server may hold run(s) with external_run_id"),
        "{}",
        r.stderr
    );
    let kept = r.summary["streaming"]["rows_kept"].as_u64().unwrap_or(0);
    assert_eq!(kept as usize, r.rows().len(), "{}", r.summary_text);
    eprintln!("hanging API: exit after {wall:.1} s, {kept} rows kept");
}

#[test]
fn api_down_at_start_then_up_loses_nothing() {
    let Some(moto) = Moto::start("stream-apidown", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto).fault("register", &["status:503", "close", "status:502"]));
    let dir = Scratch::new("stream-apidown");
    let r = run_streamed(&dir, &m, "1", &["sleep", "5"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_lossless(&moto, &m, &r);
    let regs = m.records_of("register");
    assert_eq!(regs.len(), 4, "three failures then success: {regs:?}");
    let said = r
        .stderr
        .lines()
        .filter(|l| l.contains("registering the run failed"))
        .count();
    assert_eq!(said, 1, "said once:\n{}", r.stderr);
}

#[test]
fn api_never_reachable_keeps_everything_locally() {
    let dir = Scratch::new("stream-noapi");
    let api = closed_url();
    let t0 = Instant::now();
    let r = run_with(
        &dir,
        command(
            &dir,
            &api,
            &closed_url(),
            "1",
            &["sh", "-c", "sleep 2; exit 4"],
        ),
    );
    let wall = t0.elapsed();
    assert_eq!(
        r.status.code(),
        Some(4),
        "the command's exit code: {}",
        r.stderr
    );
    let said = r
        .stderr
        .lines()
        .filter(|l| l.contains("registering the run failed"))
        .count();
    assert_eq!(said, 1, "said once:\n{}", r.stderr);
    assert!(r.stderr.contains(&api), "names the API: {}", r.stderr);
    // What could not be sent is on disk, as standalone gzip CSVs = the local rows.
    let kept = r.summary["streaming"]["kept_dir"]
        .as_str()
        .expect("kept_dir");
    let mut files: Vec<PathBuf> = std::fs::read_dir(kept)
        .expect("kept dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for f in &files {
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(f).expect("open")),
            &mut text,
        )
        .expect("gzip");
        let mut l = text.lines();
        assert_eq!(l.next(), Some(r.header()));
        rows.extend(l.map(str::to_string));
    }
    assert_eq!(rows, r.rows(), "kept batches = local rows");
    assert!(r.dir.exists());
    assert_no_token(&r);
    // Refused connections cost nothing: no waiting on timeouts at the end.
    assert!(wall < Duration::from_secs(8), "took {wall:?}");
}

#[test]
fn sigterm_mid_run_still_finishes() {
    let Some(moto) = Moto::start("stream-term", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto));
    let dir = Scratch::new("stream-term");
    let mut c = command(&dir, &m.api_url(), &m.s3_url(), "1", &["sleep", "60"]);
    c.stderr(Stdio::null());
    let mut bg = Bg::spawn(&mut c, "tracker");
    m.wait_records("s3_put", 1, Duration::from_secs(20));
    bg.signal(libc::SIGTERM);
    let status = bg.wait_for(Duration::from_secs(40));
    let r = collect(&dir, status, String::new());
    assert_eq!(r.status.code(), Some(128 + 15), "the command's exit code");
    assert_lossless(&moto, &m, &r);
    let fin = &m.records_of("finish")[0]["body"];
    assert_eq!(fin["exit_code"], 143);
    assert_eq!(fin["run_status"], "failed");
}

#[test]
fn answers_that_make_no_sense_get_a_warning_and_the_run_goes_on() {
    // (scenario, words the warning must contain)
    let cases: Vec<(Scenario, &str)> = vec![
        (
            Scenario::offline().fault("register", &["malformed"]),
            "not JSON",
        ),
        (
            Scenario::offline().fault("register", &["missing:upload_credentials"]),
            "upload_credentials",
        ),
        (
            Scenario::offline().fault("register", &["missing:run_id"]),
            "run_id",
        ),
        (
            Scenario::offline().fault("register", &["bad_prefix"]),
            "s3://",
        ),
        (
            Scenario::offline().issue(Issue {
                omit: vec!["session_token".into()],
                ..Issue::default()
            }),
            "session_token",
        ),
        (
            Scenario::offline().issue(Issue {
                expiry_raw: Some(Value::String("soon".into())),
                ..Issue::default()
            }),
            "'soon'",
        ),
        (
            Scenario::offline().fault("register", &["status:422:bad metadata"]),
            "422",
        ),
        // An error body that echoes the token: the warning must not repeat it.
        (
            Scenario::offline().fault("register", &[&format!("status:401:bad token {TOKEN}")]),
            "401",
        ),
    ];
    for (i, (sc, words)) in cases.into_iter().enumerate() {
        let m = mock(&sc);
        let dir = Scratch::new(&format!("stream-bad-{i}"));
        let r = run_streamed(&dir, &m, "60", &["sh", "-c", "sleep 0.5; exit 3"]);
        assert_eq!(r.status.code(), Some(3), "case {i}: {}", r.stderr);
        let warn = r
            .stderr
            .lines()
            .find(|l| l.contains("registering the run failed"))
            .unwrap_or_else(|| panic!("case {i}: no warning:\n{}", r.stderr));
        assert!(
            warn.contains(words),
            "case {i}: warning without '{words}': {warn}"
        );
        assert_no_token(&r);
    }
}

#[test]
fn no_token_no_connection() {
    // Everything the tracker could contact points at one listener, which must see
    // nothing; the same listener does see the tracker when a token is set (so the
    // check can fail).
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    let dir = Scratch::new("stream-notoken");
    let connections = |l: &std::net::TcpListener| {
        let mut n = 0;
        while l.accept().is_ok() {
            n += 1;
        }
        n
    };
    for token in [None, Some("")] {
        let mut c = command(&dir, &url, &url, "1", &["true"]);
        c.env_remove("SENTINEL_API_TOKEN");
        for v in [
            "TRACKER_METADATA_URL",
            "TRACKER_METADATA_GCP_URL",
            "TRACKER_METADATA_ALIBABA_URL",
        ] {
            c.env(v, &url);
        }
        if let Some(t) = token {
            c.env("SENTINEL_API_TOKEN", t);
        }
        let r = run_with(&dir, c);
        assert!(r.status.success(), "{}", r.stderr);
        assert_eq!(connections(&l), 0, "token {token:?}: a connection was made");
        assert!(r.summary["streaming"].is_null());
        // Only the run summary: no warning, nothing about Sentinel.
        assert!(
            r.stderr
                .lines()
                .all(|l| l.starts_with("resource-tracker: ") && !l.contains("Sentinel")),
            "nothing to say: {}",
            r.stderr
        );
    }
    let mut c = command(&dir, &url, &url, "1", &["true"]);
    c.env("TRACKER_HTTP_TIMEOUT", "0.3");
    let _ = c.output();
    assert!(
        connections(&l) > 0,
        "control: with a token the listener is contacted"
    );
}

#[test]
fn no_token_in_a_namespace_without_routes_runs_clean() {
    if !require(is_root(), "network namespaces need root")
        || !require(have("ip"), "iproute2 missing")
    {
        return;
    }
    let ns = format!("rt-noroute-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .map(|s| s.success());
    assert_eq!(ok.ok(), Some(true), "ip netns add {ns}");
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(ns.clone());
    let dir = Scratch::new("stream-netns");
    let run = |token: Option<&str>| {
        let mut c = Command::new("ip");
        clean_env(&mut c);
        c.args(["netns", "exec", &ns])
            .arg(tracker())
            .args(["run", "--no-ebpf", "-q", "-i", "0.2", "--summary"])
            .arg(dir.path("summary.json"))
            .args(["--", "true"])
            .env("TRACKER_HTTP_TIMEOUT", "1")
            .env("TRACKER_SPOOL_DIR", &dir.0)
            .env("SENTINEL_API_URL", "http://192.0.2.1:8080");
        if let Some(t) = token {
            c.env("SENTINEL_API_TOKEN", t);
        }
        let t0 = Instant::now();
        let o = c.output().expect("ip netns exec");
        (
            o.status,
            String::from_utf8_lossy(&o.stderr).into_owned(),
            t0.elapsed(),
        )
    };
    let (st, err, wall) = run(None);
    assert!(st.success(), "{err}");
    // `ip netns exec` mounts a sysfs of its own, without the cgroup file systems:
    // the memory source's one line says so, and is the only line.
    let others: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains("(memory_source pss)"))
        .collect();
    assert!(others.is_empty(), "no error without a token: {err}");
    // Nothing waited on the network: well under one request timeout.
    assert!(wall < Duration::from_millis(900), "took {wall:?}");
    // Control: with a token the same run does try, fails, and says so.
    let (st, err, _) = run(Some(TOKEN));
    assert!(st.success(), "{err}");
    assert!(err.contains("registering the run failed"), "{err}");
    assert!(!err.contains(TOKEN));
}

/// A tmpfs of `kib` KiB mounted at `at` (root only), unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: PathBuf, kib: u32, ro: bool) -> Tmpfs {
        std::fs::create_dir_all(&at).expect("mount point");
        let opts = format!("size={kib}k,mode=0755{}", if ro { ",ro" } else { "" });
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(&at)
            .status()
            .expect("mount");
        assert!(ok.success(), "mount a tmpfs at {}", at.display());
        Tmpfs(at)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Rows of every `NNNN.csv.gz` in `dir`, in name order, after the header.
fn kept_rows(dir: &Path, header: &str) -> Vec<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("kept dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for f in &files {
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(f).expect("open")),
            &mut text,
        )
        .expect("gzip");
        let mut l = text.lines();
        assert_eq!(l.next(), Some(header), "{}", f.display());
        rows.extend(l.map(str::to_string));
    }
    rows
}

/// The spool fills mid-run while S3 answers 503 (a 16 KiB tmpfs, 12 KiB of it
/// taken; a 2 KiB memory limit): no row is dropped. The spool's failure is said
/// once and named in the samples and the summary, later batches wait in kept
/// files, and once S3 is back every row reaches it.
#[test]
fn a_spool_that_fills_mid_run_loses_no_row() {
    if !require(is_root(), "mounting a small tmpfs needs root") {
        return;
    }
    let Some(moto) = Moto::start("stream-spoolfull", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto).fault("s3_put", &["status:503"; 6]));
    let dir = Scratch::new("stream-spoolfull");
    let spool = Tmpfs::mount(dir.path("spool"), 16, false);
    std::fs::write(spool.0.join("fill"), vec![7u8; 12 << 10]).expect("fill the tmpfs");
    let tmp = dir.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let mut c = command(&dir, &m.api_url(), &m.s3_url(), "1", &["sleep", "9"]);
    c.env("TRACKER_UPLOAD_MEMORY_LIMIT", "2048")
        .env("TRACKER_SPOOL_DIR", &spool.0)
        .env("TMPDIR", &tmp);
    let r = run_with(&dir, c);
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.summary["streaming"];
    assert!(
        s["spool_failed"]
            .as_str()
            .is_some_and(|d| d.contains("spool")),
        "{s}\n{}",
        r.stderr
    );
    let said = r
        .stderr
        .lines()
        .filter(|l| l.contains("Sentinel: the spool failed"))
        .count();
    assert_eq!(said, 1, "warned once:\n{}", r.stderr);
    assert!(
        r.summary["degraded"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x["name"] == "spool_failed")),
        "{}",
        r.summary["degraded"]
    );
    assert!(
        r.local
            .lines()
            .last()
            .unwrap_or_default()
            .contains("spool_failed"),
        "the last sample names it"
    );
    let batches = assert_lossless(&moto, &m, &r);
    eprintln!(
        "rows produced {} = rows in S3 ({batches} objects); spooled batches {}",
        r.rows().len(),
        s["spooled_batches"]
    );
    assert_eq!(s["rows_not_sent"], 0, "{s}");
    assert_eq!(s["partial"], false, "{s}");
    // Kept files of uploaded batches are gone.
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .flatten()
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The spool directory fills before the end, with the API unreachable: the
/// batches that cannot be kept there are kept under the temp dir instead; rows
/// produced = rows kept, and the summary counts them as not sent.
#[test]
fn a_spool_dir_full_at_the_end_keeps_every_row_elsewhere() {
    if !require(is_root(), "mounting a small tmpfs needs root") {
        return;
    }
    let dir = Scratch::new("stream-endfull");
    let spool = Tmpfs::mount(dir.path("spool"), 16, false);
    let tmp = dir.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let fill = format!(
        "sleep 1.5; head -c 65536 /dev/zero > {}/fill 2>/dev/null; sleep 0.5; exit 4",
        spool.0.display()
    );
    let mut c = command(
        &dir,
        &closed_url(),
        &closed_url(),
        "1",
        &["sh", "-c", &fill],
    );
    c.env("TRACKER_SPOOL_DIR", &spool.0).env("TMPDIR", &tmp);
    let r = run_with(&dir, c);
    assert_eq!(r.status.code(), Some(4), "{}", r.stderr);
    let s = &r.summary["streaming"];
    let kept = s["kept_dir"].as_str().expect("kept_dir");
    assert!(Path::new(kept).starts_with(&tmp), "kept in {kept}: {s}");
    assert_eq!(kept_rows(Path::new(kept), r.header()), r.rows());
    let n = r.rows().len() as u64;
    eprintln!("rows produced {n} = rows kept in {kept}");
    assert_eq!(
        (
            s["rows"].as_u64(),
            s["rows_kept"].as_u64(),
            s["rows_not_sent"].as_u64()
        ),
        (Some(n), Some(n), Some(n)),
        "{s}"
    );
    assert!(r.stderr.contains("instead"), "{}", r.stderr);
}

/// A spool directory that exists but takes no file is refused at start (exit 2,
/// one line naming it), and the command is not started.
#[test]
fn a_spool_dir_that_cannot_be_written_is_refused_at_start() {
    let dir = Scratch::new("stream-spoolro");
    let mut dirs = vec![PathBuf::from("/proc")];
    let _ro = is_root().then(|| {
        let t = Tmpfs::mount(dir.path("ro"), 16, true);
        dirs.push(t.0.clone());
        t
    });
    // Full from the start: the write that proves it fails.
    let _full = is_root().then(|| {
        let t = Tmpfs::mount(dir.path("full"), 16, false);
        let _ = std::fs::write(t.0.join("fill"), vec![7u8; 64 << 10]);
        dirs.push(t.0.clone());
        t
    });
    for d in dirs {
        let mut c = command(&dir, &closed_url(), &closed_url(), "1", &["touch"]);
        c.arg(dir.path("started")).env("TRACKER_SPOOL_DIR", &d);
        let o = c.output().expect("run");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", d.display());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("TRACKER_SPOOL_DIR") && err.contains(&*d.to_string_lossy()),
            "{err}"
        );
        assert!(!dir.path("started").exists(), "the command started");
    }
}

/// Registration answered with garbage every time: each answer may have made a
/// run on the server, so registering stops after three, the count is in the
/// summary, a warning names the run id the server may hold, and the rows are
/// kept locally; the exit code stays the command's.
#[test]
fn unusable_registration_answers_stop_after_three_and_are_said() {
    let m = mock(&Scenario::offline().fault("register", &["malformed"; 20]));
    let dir = Scratch::new("stream-garbage-reg");
    let r = run_streamed(&dir, &m, "1", &["sh", "-c", "sleep 6; exit 3"]);
    assert_eq!(r.status.code(), Some(3), "{}", r.stderr);
    let regs = m.records_of("register").len();
    assert_eq!(regs, 3, "registrations tried: {regs}\n{}", r.stderr);
    let s = &r.summary["streaming"];
    assert_eq!(s["registrations_not_understood"], 3, "{s}");
    assert!(
        r.stderr.contains("registering stops") && r.stderr.contains("external_run_id"),
        "{}",
        r.stderr
    );
    let kept = s["kept_dir"].as_str().expect("kept_dir");
    assert_eq!(kept_rows(Path::new(kept), r.header()), r.rows());
    assert_no_token(&r);
}

/// S3 answers 403 to every PUT: credentials are refreshed with a gap that
/// doubles, not twice per retry (71 refreshes in the probe's run), and the rows
/// still reach Sentinel inline at the end.
#[test]
fn a_persistent_403_does_not_storm_the_refresh_endpoint() {
    let Some(moto) = Moto::start("stream-403-storm", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto).fault("s3_put", &["status:403:AccessDenied"; 200]));
    let dir = Scratch::new("stream-403-storm");
    let r = run_streamed(&dir, &m, "1", &["sleep", "10"]);
    assert!(r.status.success(), "{}", r.stderr);
    let refreshes = m.records_of("refresh").len();
    let puts = m.records_of("s3_put").len();
    eprintln!("10 s of 403: {puts} PUTs, {refreshes} refreshes");
    assert!(
        (1..=6).contains(&refreshes),
        "{refreshes} refreshes for {puts} PUTs"
    );
    let fin: Vec<Value> = m
        .records_of("finish")
        .into_iter()
        .filter(|f| f["status"] == 200)
        .collect();
    assert_eq!(fin.len(), 1, "{fin:?}");
    assert_eq!(fin[0]["body"]["data_source"], "inline");
    assert_eq!(
        fin[0]["body"]["data_csv"].as_str(),
        Some(r.local.as_str()),
        "inline CSV = local CSV"
    );
}

/// Two batches reach S3, then S3 answers 503 to the end while the spool is full:
/// rows produced = rows in S3 + rows kept, `finish` lists only what is in S3 and
/// says `failed`, and the summary says `partial` with the count not sent.
#[test]
fn some_batches_in_s3_the_rest_kept_is_partial_and_counted() {
    if !require(is_root(), "mounting a small tmpfs needs root") {
        return;
    }
    let Some(moto) = Moto::start("stream-partial", 2) else {
        return;
    };
    let mut faults = vec!["ok"; 2];
    faults.extend(["status:503"; 300]);
    let m = mock(&Scenario::new(&moto).fault("s3_put", &faults));
    let dir = Scratch::new("stream-partial");
    let spool = Tmpfs::mount(dir.path("spool"), 16, false);
    std::fs::write(spool.0.join("fill"), vec![7u8; 12 << 10]).expect("fill the tmpfs");
    let tmp = dir.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let mut c = command(&dir, &m.api_url(), &m.s3_url(), "1", &["sleep", "6"]);
    c.env("TRACKER_UPLOAD_MEMORY_LIMIT", "2048")
        .env("TRACKER_SPOOL_DIR", &spool.0)
        .env("TMPDIR", &tmp);
    let r = run_with(&dir, c);
    assert!(r.status.success(), "{}", r.stderr);
    let (in_s3, uris) = bucket_rows(&moto, &r);
    let s = &r.summary["streaming"];
    let kept_dir = s["kept_dir"].as_str().expect("kept_dir");
    let kept = kept_rows(Path::new(kept_dir), r.header());
    eprintln!(
        "rows produced {} = rows in S3 {} + rows kept {}",
        r.rows().len(),
        in_s3.len(),
        kept.len()
    );
    let mut all = in_s3.clone();
    all.extend(kept.iter().cloned());
    assert_eq!(all, r.rows(), "S3 then kept = the local rows, in order");
    assert_eq!(s["partial"], true, "{s}");
    assert_eq!(s["rows_not_sent"].as_u64(), Some(kept.len() as u64), "{s}");
    assert_eq!(s["rows_kept"].as_u64(), Some(kept.len() as u64), "{s}");
    let fin: Vec<Value> = m
        .records_of("finish")
        .into_iter()
        .filter(|f| f["status"] == 200)
        .collect();
    assert_eq!(fin.len(), 1, "{fin:?}");
    assert_eq!(fin[0]["body"]["run_status"], "failed");
    assert_eq!(fin[0]["body"]["data_uris"], serde_json::json!(uris));
}

/// Guardians of the tracker `pid` (argv `resource-tracker-guardian PID`).
fn guardians_of(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{p}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.first() == Some(&&b"resource-tracker-guardian"[..])
            && args.get(1) == Some(&pid.to_string().as_bytes())
        {
            found.push(p);
        }
    }
    found
}

/// The children of process `pid` (all its threads').
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let c = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(c.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    out
}

/// When the tracker is killed in [`a_killed_tracker_loses_no_row_and_its_run_is_finished`].
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kill {
    /// While the tracker's registration waits for its answer (the API is slow):
    /// the guardian registers the run itself and says which run the server may
    /// hold unfinished.
    RegistrationInFlight,
    /// Right after the registration was answered.
    Registered,
    /// Rows produced, none uploaded yet.
    BeforeFirstUpload,
    /// A while after the n-th upload, before the next.
    AfterUploads(usize),
    /// While the second PUT waits at a slow S3, which stores it 4 s later, after
    /// the guardian has put its rows: the guardian writes exactly those rows under
    /// that key, so the late landing repeats them and loses none.
    DuringSlowPut,
    /// While the first PUT waits at a slow S3, which stores it later: its rows
    /// are not sent inline as well.
    DuringFirstPut,
    /// S3 answers 503 and `finish` 400 throughout: the guardian keeps the rows.
    ServerRefuses,
    /// The spool filled (batches went to a kept directory under TMPDIR) while S3
    /// answered 503: those copies go once the guardian has saved the rows.
    SpoolFull,
}

/// SIGKILL of the tracker at different moments: its guardian uploads the rows
/// not yet sent (or keeps them) and finishes the run as failed. Rows produced (the
/// local CSV, written per sample) = rows in S3 + inline + kept, in order; one
/// accepted finish (none where the server refuses it); the guardian gone within a
/// bound; nothing left in the spool or temp directory but what was kept.
#[test]
fn a_killed_tracker_loses_no_row_and_its_run_is_finished() {
    let Some(moto) = Moto::start("stream-kill", 2) else {
        return;
    };
    let mut moments = vec![
        Kill::Registered,
        Kill::BeforeFirstUpload,
        Kill::AfterUploads(1),
        Kill::AfterUploads(3),
        Kill::DuringSlowPut,
        Kill::DuringFirstPut,
        Kill::RegistrationInFlight,
        Kill::ServerRefuses,
    ];
    if is_root() {
        moments.push(Kill::SpoolFull);
    }
    for (i, when) in moments.into_iter().enumerate() {
        let prefix = format!("kill{i}");
        let mut sc = Scenario::new(&moto).prefix(&prefix);
        match when {
            Kill::ServerRefuses => {
                sc = sc
                    .fault("s3_put", &["status:503"; 300])
                    .fault("finish", &["status:400"; 5]);
            }
            Kill::SpoolFull => sc = sc.fault("s3_put", &["status:503"; 300]),
            Kill::RegistrationInFlight => sc = sc.fault("register", &["sleep:2000"]),
            Kill::DuringSlowPut => sc = sc.fault("s3_put", &["ok", "sleep:4000"]),
            Kill::DuringFirstPut => sc = sc.fault("s3_put", &["sleep:4000"]),
            _ => {}
        }
        let m = mock(&sc);
        let dir = Scratch::new("stream-kill");
        let tmp = dir.path("tmp");
        std::fs::create_dir(&tmp).expect("tmp");
        let (spool, _tmpfs) = match when {
            Kill::SpoolFull => {
                let t = Tmpfs::mount(dir.path("spool"), 16, false);
                std::fs::write(t.0.join("fill"), vec![7u8; 12 << 10]).expect("fill the tmpfs");
                (t.0.clone(), Some(t))
            }
            _ => {
                std::fs::create_dir(dir.path("spool")).expect("spool dir");
                (dir.path("spool"), None)
            }
        };
        let mut c = command(&dir, &m.api_url(), &m.s3_url(), "1", &["sleep", "60"]);
        let err = std::fs::File::create(dir.path("stderr")).expect("stderr file");
        c.env("TRACKER_SPOOL_DIR", &spool)
            .env("TMPDIR", &tmp)
            .stderr(err);
        if when == Kill::SpoolFull {
            c.env("TRACKER_UPLOAD_MEMORY_LIMIT", "2048");
        }
        let mut bg = Bg::spawn(&mut c, "tracker");
        let pid = bg.pid();
        let wait = Duration::from_secs(20);
        match when {
            Kill::RegistrationInFlight => std::thread::sleep(Duration::from_millis(900)),
            Kill::Registered => {
                m.wait_records("register", 1, wait);
                std::thread::sleep(Duration::from_millis(100));
            }
            Kill::BeforeFirstUpload => {
                m.wait_records("register", 1, wait);
                std::thread::sleep(Duration::from_millis(500));
            }
            Kill::AfterUploads(n) => {
                m.wait_records("s3_put", n, wait);
                std::thread::sleep(Duration::from_millis(400));
            }
            Kill::ServerRefuses => {
                m.wait_records("s3_put", 2, wait);
            }
            Kill::SpoolFull => {
                m.wait_records("s3_put", 5, wait);
            }
            // The mock records a PUT when it answers: the second (or first) is
            // sent about a second after the one before.
            Kill::DuringSlowPut => {
                m.wait_records("s3_put", 1, wait);
                std::thread::sleep(Duration::from_millis(1500));
            }
            Kill::DuringFirstPut => {
                m.wait_records("register", 1, wait);
                std::thread::sleep(Duration::from_millis(2000));
            }
        }
        let command_pids = children_of(pid);
        bg.signal(libc::SIGKILL);
        bg.wait_for(Duration::from_secs(5));
        for p in command_pids {
            // SAFETY: the test's own grandchild (the tracked `sleep`), orphaned.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        // The guardian's bound: its end takes at most FINISH_BUDGET (30 s) plus a
        // request time-out (1 s here).
        let t0 = Instant::now();
        while !guardians_of(pid).is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(35),
                "{when:?}: guardian still there"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let took = t0.elapsed();
        if matches!(when, Kill::DuringSlowPut | Kill::DuringFirstPut) {
            // The slow PUT lands (4 s after it was sent) before S3 is read: the
            // mock records it once it has passed it on.
            let t0 = Instant::now();
            while !m.records_of("s3_put").iter().any(|p| {
                p["action"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("sleep:"))
            }) {
                assert!(t0.elapsed() < wait, "{when:?}: the slow PUT never landed");
                std::thread::sleep(Duration::from_millis(100));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let stderr = std::fs::read_to_string(dir.path("stderr")).unwrap_or_default();
        assert!(!stderr.contains("panicked"), "{stderr}");
        let local = std::fs::read_to_string(dir.path("local.csv")).expect("local.csv");
        let header = local.lines().next().unwrap_or_default().to_string();
        let produced: Vec<String> = local.lines().skip(1).map(str::to_string).collect();
        let mut in_s3 = Vec::new();
        for o in moto.dump(&moto.bucket, &format!("{prefix}/")) {
            let text = o.text.unwrap_or_else(|e| panic!("{}: {e}", o.key));
            let mut l = text.lines();
            assert_eq!(l.next(), Some(header.as_str()), "{}", o.key);
            in_s3.extend(l.map(str::to_string));
        }
        let fin: Vec<Value> = m
            .records_of("finish")
            .into_iter()
            .filter(|f| f["status"] == 200)
            .collect();
        let inline: Vec<String> = fin
            .iter()
            .filter_map(|f| f["body"]["data_csv"].as_str())
            .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
            .collect();
        let mut kept = Vec::new();
        let mut left = Vec::new();
        for e in std::fs::read_dir(&spool).expect("spool").flatten() {
            if e.file_name() == "fill" {
                continue;
            }
            if e.file_name()
                .to_string_lossy()
                .starts_with("resource-tracker-unsent-")
            {
                kept.extend(kept_rows(&e.path(), &header));
            } else {
                left.push(e.path());
            }
        }
        left.extend(
            std::fs::read_dir(&tmp)
                .expect("tmp")
                .flatten()
                .map(|e| e.path()),
        );
        eprintln!(
            "{when:?}: rows produced {} = in S3 {} + inline {} + kept {}; finish accepted {}; guardian gone {took:?} after the kill",
            produced.len(),
            in_s3.len(),
            inline.len(),
            kept.len(),
            fin.len()
        );
        let mut all = in_s3.clone();
        all.extend(inline);
        all.extend(kept.iter().cloned());
        assert_eq!(
            all, produced,
            "{when:?}: S3, inline, kept = produced\n{stderr}"
        );
        let registered = m
            .records_of("register")
            .iter()
            .filter(|r| r["status"] == 200)
            .count();
        if when == Kill::RegistrationInFlight {
            m.wait_records("register", 2, wait);
            assert!(stderr.contains("external_run_id"), "{stderr}");
        } else {
            assert_eq!(registered, 1, "{when:?}: one run\n{stderr}");
        }
        if when == Kill::ServerRefuses {
            assert!(fin.is_empty(), "{fin:?}");
            assert_eq!(kept.len(), produced.len(), "{when:?}: all kept\n{stderr}");
            assert!(stderr.contains("kept in"), "{stderr}");
        } else if registered > 0 {
            assert_eq!(fin.len(), 1, "{when:?}: one accepted finish\n{stderr}");
            let body = &fin[0]["body"];
            assert_eq!(body["run_status"], "failed", "{body}");
            assert_eq!(body["exit_code"], 137, "{body}");
            assert!(kept.is_empty(), "{when:?}: kept {}", kept.len());
        }
        assert!(left.is_empty(), "{when:?}: left behind: {left:?}\n{stderr}");
        assert!(!stderr.contains(TOKEN), "{stderr}");
        assert!(
            stderr.contains("guardian:") || produced.is_empty(),
            "{when:?}: the guardian says what it did\n{stderr}"
        );
        if when == Kill::SpoolFull {
            assert!(stderr.contains("the spool failed"), "{stderr}");
        }
    }
}

/// Streaming off: no guardian. Streaming on: one while the tracker runs, none
/// once it has ended cleanly (and then it did nothing: one finish).
#[test]
fn a_guardian_only_with_streaming_and_gone_after_a_clean_end() {
    let dir = Scratch::new("stream-guardian-off");
    let mut c = Command::new(tracker());
    clean_env(&mut c);
    c.args(["run", "--no-ebpf", "-i", "0.2", "-q", "--", "sleep", "1.5"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut bg = Bg::spawn(&mut c, "tracker");
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        guardians_of(bg.pid()).is_empty(),
        "a guardian without streaming"
    );
    assert!(bg.wait_for(Duration::from_secs(10)).success());

    let Some(moto) = Moto::start("stream-guardian", 2) else {
        return;
    };
    let m = mock(&Scenario::new(&moto));
    let mut c = command(&dir, &m.api_url(), &m.s3_url(), "1", &["sleep", "2"]);
    c.stderr(Stdio::null());
    let mut bg = Bg::spawn(&mut c, "tracker");
    m.wait_records("register", 1, Duration::from_secs(20));
    let pid = bg.pid();
    let g = guardians_of(pid);
    assert_eq!(g.len(), 1, "one guardian while streaming");
    // Not the tracker's child: never taken for a member of the tracked tree.
    assert!(!children_of(pid).contains(&g[0]), "the guardian is a child");
    let environ = std::fs::read(format!("/proc/{}/environ", g[0])).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&environ).contains(TOKEN),
        "the token in the guardian's environment"
    );
    assert!(bg.wait_for(Duration::from_secs(30)).success());
    let t0 = Instant::now();
    while !guardians_of(pid).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(2), "guardian left over");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        m.records_of("finish").len(),
        1,
        "finished once, by the tracker"
    );

    // Under sudo the guardian is the invoking user's, as the command.
    if !is_root() {
        return;
    }
    let m = mock(&Scenario::new(&moto).prefix("sudo"));
    let dead = closed_url();
    let mut c = Command::new(tracker());
    clean_env(&mut c);
    c.env("SENTINEL_API_TOKEN", TOKEN)
        .env("SENTINEL_API_URL", m.api_url())
        .env("TRACKER_S3_ENDPOINT", m.s3_url())
        .env("TRACKER_HTTP_TIMEOUT", "1")
        .env("TRACKER_METADATA_URL", &dead)
        .env("TRACKER_METADATA_GCP_URL", &dead)
        .env("TRACKER_METADATA_ALIBABA_URL", &dead)
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .args(["run", "--no-ebpf", "-q", "--", "sleep", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut bg = Bg::spawn(&mut c, "tracker");
    m.wait_records("register", 1, Duration::from_secs(20));
    let g = guardians_of(bg.pid());
    assert_eq!(g.len(), 1, "one guardian under sudo");
    let status = std::fs::read_to_string(format!("/proc/{}/status", g[0])).unwrap_or_default();
    let uid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>();
    assert_eq!(uid, ["65534"; 4], "the guardian's ids: {status}");
    assert!(bg.wait_for(Duration::from_secs(30)).success());
}

/// What a hostile API listener answers every request with.
#[derive(Clone)]
enum Hostile {
    /// `307` to this location (`SELF` stands for the listener's own URL).
    Redirect(String),
    /// `200` whose body never ends: `[` bytes until the client leaves, 3 GiB or
    /// 60 s, whichever comes first.
    Flood,
    /// `200` whose body comes a byte every 200 ms, and never ends (up to 120 s):
    /// never idle long enough for a read time-out.
    Trickle,
}

/// An HTTP listener on 127.0.0.1 that answers every request the same way and
/// keeps each request's head; it stops when dropped.
struct HostileApi {
    url: String,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostileApi {
    fn start(answer: Hostile) -> HostileApi {
        use std::io::{Read as _, Write as _};
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, s) = (heads.clone(), stop.clone());
        let own = url.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((mut c, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                // The head, then the body its Content-Length announces.
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                let head_end = loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break None,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                    if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break Some(i + 4);
                    }
                };
                let Some(head_end) = head_end else { continue };
                let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while got.len() < head_end + len {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                h.lock().expect("heads").push(head);
                match &answer {
                    Hostile::Redirect(to) => {
                        let to = to.replace("SELF", &own);
                        let _ = write!(
                            c,
                            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}\r\n\
                             Content-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                    }
                    Hostile::Trickle => {
                        let _ = c.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                              Connection: close\r\n\r\n",
                        );
                        let t0 = Instant::now();
                        while t0.elapsed() < Duration::from_secs(120) {
                            if c.write_all(b" ").is_err() {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                    Hostile::Flood => {
                        let _ = c.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                              Connection: close\r\n\r\n",
                        );
                        let chunk = vec![b'['; 64 * 1024];
                        let t0 = Instant::now();
                        let mut sent: u64 = 0;
                        while sent < 3 << 30 && t0.elapsed() < Duration::from_secs(60) {
                            if c.write_all(&chunk).is_err() {
                                break;
                            }
                            sent += chunk.len() as u64;
                        }
                    }
                }
            }
        });
        HostileApi {
            url,
            heads,
            stop,
            thread: Some(thread),
        }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("heads").clone()
    }
}

impl Drop for HostileApi {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `c`, returning its output and its peak resident memory (KiB, the
/// tracker's own and that of the children it waited for).
// The child is reaped by wait4, for the rusage `Child::wait` does not give.
#[allow(clippy::zombie_processes)]
fn run_measured(c: &mut Command) -> (ExitStatus, String, i64, Duration) {
    use std::io::Read as _;
    let t0 = Instant::now();
    let mut child = c.spawn().expect("run the tracker");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid out-pointers.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(r, child.id() as i32, "wait4");
    let wall = t0.elapsed();
    let stderr = reader.join().unwrap_or_default();
    use std::os::unix::process::ExitStatusExt as _;
    (ExitStatus::from_raw(status), stderr, ru.ru_maxrss, wall)
}

/// The token goes to the configured origin and nowhere else, through any redirect
/// chain: the API redirects to another origin that redirects to itself (where a
/// client that drops the header on the first cross-origin hop would add it back).
/// No redirect is followed; the run goes on locally and the refusal is one line.
#[test]
fn the_token_never_follows_a_redirect() {
    let other = HostileApi::start(Hostile::Redirect("SELF/again".into()));
    let chain = HostileApi::start(Hostile::Redirect(format!("{}/runs", other.url)));
    let dir = Scratch::new("stream-redirect");
    let dead = closed_url();
    let mut c = command(&dir, &chain.url, &dead, "1", &["true"]);
    let (status, stderr, _, wall) = run_measured(&mut c);
    let r = collect(&dir, status, stderr);
    assert!(r.status.success(), "{}", r.stderr);
    assert_no_token(&r);
    let asked = chain.heads();
    assert!(!asked.is_empty(), "the API was never asked");
    // The configured origin gets the token (the check can fail)...
    assert!(
        asked
            .iter()
            .all(|h| h.contains(&format!("authorization: Bearer {TOKEN}"))
                || h.contains(&format!("Authorization: Bearer {TOKEN}"))),
        "{asked:?}"
    );
    // ...and the other origin never hears from the tracker.
    assert_eq!(
        other.heads(),
        Vec::<String>::new(),
        "a redirect was followed"
    );
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("a redirect to"))
        .collect();
    assert!(
        !said.is_empty() && said.iter().all(|l| l.contains(&other.url)),
        "the redirect is named: {}",
        r.stderr
    );
    assert!(wall < Duration::from_secs(40), "took {wall:?}");
}

/// An API whose answer trickles (a byte every 200 ms, never ending): each request
/// ends at its time-out all the same, and the exit waits no longer than the end's
/// budget and one time-out.
#[test]
fn an_answer_that_trickles_ends_at_the_time_out() {
    let api = HostileApi::start(Hostile::Trickle);
    let dir = Scratch::new("stream-trickle");
    let dead = closed_url();
    let mut c = command(&dir, &api.url, &dead, "1", &["sleep", "1"]);
    c.env("TRACKER_HTTP_TIMEOUT", "5");
    let t0 = Instant::now();
    let r = run_with(&dir, c);
    let wall = t0.elapsed();
    assert!(r.status.success(), "{}", r.stderr);
    assert!(!api.heads().is_empty(), "the API was never asked");
    assert!(
        wall < Duration::from_secs(1 + 30 + 5 + 3),
        "took {wall:?}:\n{}",
        r.stderr
    );
    eprintln!("trickling API: exit after {wall:?}");
}

/// An API whose answer never ends (3 GiB of `[` without a length): the tracker
/// reads no more than the largest answer the API gives, keeps its memory, and the
/// command's run is not held by it.
#[test]
fn an_answer_that_floods_is_not_read() {
    let api = HostileApi::start(Hostile::Flood);
    let dir = Scratch::new("stream-flood");
    let dead = closed_url();
    let mut c = command(&dir, &api.url, &dead, "1", &["true"]);
    c.env("TRACKER_HTTP_TIMEOUT", "5");
    let (status, stderr, maxrss_kib, wall) = run_measured(&mut c);
    let r = collect(&dir, status, stderr);
    assert!(r.status.success(), "{}", r.stderr);
    assert!(!api.heads().is_empty(), "the API was never asked");
    assert!(
        maxrss_kib < 64 * 1024,
        "the tracker grew to {maxrss_kib} KiB on a flood:\n{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("larger than"),
        "the refusal is said: {}",
        r.stderr
    );
    // Three registrations at most, each refused at its first MiB.
    assert!(wall < Duration::from_secs(30), "took {wall:?}");
}
