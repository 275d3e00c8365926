//! Precedence and bad values of every layer.

use std::ffi::OsString;

use clap::{CommandFactory as _, Parser as _};

use super::*;

fn opts(args: &[&str]) -> Cli {
    let mut v = vec!["rt"];
    v.extend_from_slice(args);
    Cli::try_parse_from(v).expect("parse")
}

/// (field, variable, flag) of every metadata field, from its one definition.
fn meta_fields() -> Vec<(String, String, String)> {
    Cli::command()
        .get_arguments()
        .filter_map(|a| {
            let var = a.get_env()?.to_str()?.to_string();
            Some((a.get_id().to_string(), var, format!("--{}", a.get_long()?)))
        })
        .filter(|(id, _, _)| id != "output")
        .collect()
}

fn tmp(name: &str, body: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rt-config-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let p = dir.join("c.toml");
    std::fs::write(&p, body).expect("write");
    p
}

fn no_env(_: &str) -> Option<OsString> {
    None
}

#[test]
fn malformed_toml_names_file_line_column() {
    let p = tmp("bad", "[job]\nname = \"x\"\npid = = 3\n");
    let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
    assert!(e.contains("c.toml, line 3, column"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn wrong_type_is_an_error_with_position() {
    let p = tmp("type", "[job]\npid = \"abc\"\n");
    let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
    assert!(e.contains("line 2"), "{e}");
    let p = tmp("type2", "[tracker]\ninterval_secs = \"fast\"\n");
    let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
    assert!(e.contains("line 2"), "{e}");
    let p = tmp("type3", "job = 3\n");
    assert!(resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).is_err());
}

/// The usage guide: a config file that does not exist is ignored (with a warning
/// here); one that exists but cannot be read is still an error.
#[test]
fn explicit_missing_config_is_skipped() {
    let s = resolve(opts(&["-c", "/nonexistent/rt.toml"]), &no_env).unwrap();
    assert_eq!(s.config_file, None);
    let e = resolve(opts(&["-c", "/proc/self/mem"]), &no_env).unwrap_err();
    assert!(e.contains("/proc/self/mem"), "{e}");
}

#[test]
fn bad_values_are_named() {
    let p = tmp("iv", "[tracker]\ninterval_secs = 0\n");
    let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
    assert!(e.contains("interval_secs"), "{e}");
    let p = tmp("fmt", "[tracker]\nformat = \"xml\"\n");
    let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
    assert!(e.contains("format") && e.contains("xml"), "{e}");
    // Variables clap reads for flags are checked before it parses.
    let env = |k: &str| (k == "TRACKER_TEAM").then(|| OsString::from("a\nb"));
    let e = check_flag_env(&env).unwrap_err();
    assert!(e.contains("TRACKER_TEAM"), "{e}");
    let env = |k: &str| (k == "TRACKER_UPLOAD_INTERVAL").then(|| OsString::from("soon"));
    let e = resolve(opts(&[]), &env).unwrap_err();
    assert!(e.contains("TRACKER_UPLOAD_INTERVAL"), "{e}");
    {
        use std::os::unix::ffi::OsStringExt as _;
        let env = |k: &str| (k == "TRACKER_ENV").then(|| OsString::from_vec(vec![0xff, 0x41]));
        let e = check_flag_env(&env).unwrap_err();
        assert!(e.contains("TRACKER_ENV") && e.contains("UTF-8"), "{e}");
    }
    for bad in ["novalue", "=v"] {
        let e = resolve(opts(&["--tag", bad]), &no_env).unwrap_err();
        assert!(e.contains("--tag"), "{e}");
    }
}

/// Every metadata field, each layer: flag > environment > file > default.
#[test]
fn precedence_for_every_field() {
    let mut body = String::from("[job]\n");
    for (field, _, _) in meta_fields() {
        body.push_str(&format!("{field} = \"file-{field}\"\n"));
    }
    body.push_str("pid = 4242\ntags = { team = \"file\", only_file = \"1\" }\n");
    body.push_str("[tracker]\ninterval_secs = 7\nformat = \"csv\"\noutput = \"file.out\"\nquiet = true\nupload_interval_secs = 30\n");
    let p = tmp("prec", &body);
    let c = p.to_str().unwrap();
    let field_of = |s: &Settings, field: &str| {
        serde_json::to_value(&s.meta).unwrap()[field]
            .as_str()
            .map(str::to_string)
    };
    let fields = meta_fields();
    // The usage guide's eleven at least; the list comes from the struct.
    assert!(fields.len() >= 11, "{fields:?}");
    for (field, _var, flag) in &fields {
        // default only
        let s = resolve(opts(&["-c", "/dev/null"]), &no_env).unwrap();
        assert_eq!(field_of(&s, field), None, "{field}");
        // file
        let s = resolve(opts(&["-c", c]), &no_env).unwrap();
        assert_eq!(field_of(&s, field), Some(format!("file-{field}")));
        // flag beats file (the environment sits between them: clap reads it
        // for these flags; tests/tests/formats.rs checks all three layers)
        let s = resolve(opts(&["-c", c, flag, "cli"]), &no_env).unwrap();
        assert_eq!(field_of(&s, field).as_deref(), Some("cli"), "{flag}");
    }
    // The file's historical key for the job name.
    let p = tmp("name", "[job]\nname = \"n\"\n");
    let s = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap();
    assert_eq!(s.meta.job_name.as_deref(), Some("n"));
    let s = resolve(opts(&["-c", c]), &no_env).unwrap();
    assert_eq!(
        s.target,
        Target::Attach {
            pid: 4242,
            origin: format!("[job] pid in {c}")
        }
    );
    assert_eq!(s.interval, 7.0);
    assert_eq!(s.format, Format::Csv);
    assert_eq!(s.output, Some(PathBuf::from("file.out")));
    assert!(s.quiet);
    assert!(s.sentinel.is_none());
    assert_eq!(s.tags_sorted(), vec![("only_file", "1"), ("team", "file")]);
    let token = |k: &str| (k == "SENTINEL_API_TOKEN").then(|| OsString::from("t"));
    let upload = |s: Settings| s.sentinel.map(|c| c.upload_interval);
    assert_eq!(
        upload(resolve(opts(&["-c", c]), &token).unwrap()),
        Some(30.0)
    );
    let env = |k: &str| match k {
        "TRACKER_UPLOAD_INTERVAL" => Some(OsString::from("12")),
        _ => token(k),
    };
    let s = resolve(
        opts(&[
            "-c", c, "-p", "1", "-i", "0.5", "-f", "json", "-o", "cli.out", "--tag", "team=cli",
        ]),
        &env,
    )
    .unwrap();
    assert_eq!(
        s.target,
        Target::Attach {
            pid: 1,
            origin: "--pid".into()
        }
    );
    assert_eq!(s.interval, 0.5);
    assert_eq!(s.format, Format::Json);
    assert_eq!(s.output, Some(PathBuf::from("cli.out")));
    assert_eq!(s.tags_sorted(), vec![("only_file", "1"), ("team", "cli")]);
    assert_eq!(upload(s), Some(12.0));
    // defaults
    let s = resolve(opts(&["-c", "/dev/null"]), &token).unwrap();
    assert_eq!(
        (&s.target, s.interval, s.format, s.quiet),
        (&Target::Host, 1.0, Format::Json, false)
    );
    assert!(s.output.is_none() && s.meta.tags.is_empty());
    assert_eq!(upload(s), Some(60.0));
}

#[test]
fn unknown_keys_only_warn() {
    let p = tmp(
        "unk",
        "[job]\nname = \"a\"\ncolour = \"red\"\n[extra]\nx = 1\n",
    );
    let s = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap();
    assert_eq!(s.meta.job_name.as_deref(), Some("a"));
}

impl Settings {
    fn tags_sorted(&self) -> Vec<(&str, &str)> {
        self.meta
            .tags
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

#[test]
fn sentinel_settings_from_the_environment() {
    let with = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(*v))
        }
    };
    let o = opts(&["--", "true"]);
    // No token, or an empty one: off, and the other variables are not even read.
    let st = resolve(o.clone(), &with(&[("SENTINEL_API_URL", "nonsense")])).unwrap();
    assert!(st.sentinel.is_none());
    let st = resolve(o.clone(), &with(&[("SENTINEL_API_TOKEN", " ")])).unwrap();
    assert!(st.sentinel.is_none());
    let st = resolve(
        o.clone(),
        &with(&[
            ("SENTINEL_API_TOKEN", "tok"),
            ("SENTINEL_API_URL", "http://127.0.0.1:9/api/"),
            ("TRACKER_HTTP_TIMEOUT", "2.5"),
        ]),
    )
    .unwrap();
    let sc = st.sentinel.unwrap();
    assert_eq!(sc.api_url, "http://127.0.0.1:9/api");
    assert_eq!(sc.timeout, std::time::Duration::from_millis(2500));
    assert!(!format!("{sc:?}").contains("tok\""), "{sc:?}");
    for (pairs, needle) in [
        (
            &[("SENTINEL_API_TOKEN", "t"), ("SENTINEL_API_URL", "ftp://x")][..],
            "SENTINEL_API_URL",
        ),
        (
            &[
                ("SENTINEL_API_TOKEN", "t"),
                ("TRACKER_S3_ENDPOINT", "http://"),
            ][..],
            "TRACKER_S3_ENDPOINT",
        ),
        (
            &[("SENTINEL_API_TOKEN", "t"), ("TRACKER_HTTP_TIMEOUT", "-1")][..],
            "TRACKER_HTTP_TIMEOUT",
        ),
        (
            &[
                ("SENTINEL_API_TOKEN", "t"),
                ("TRACKER_UPLOAD_MEMORY_LIMIT", "lots"),
            ][..],
            "TRACKER_UPLOAD_MEMORY_LIMIT",
        ),
        (
            &[("TRACKER_SHARE_IDENTITY", "maybe")][..],
            "TRACKER_SHARE_IDENTITY",
        ),
        (
            &[("TRACKER_METADATA_URL", "169.254.169.254")][..],
            "TRACKER_METADATA_URL",
        ),
    ] {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let env = |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| OsString::from(v))
        };
        let e = resolve(o.clone(), &env).unwrap_err();
        assert!(e.contains(needle) && !e.contains('\n'), "{e}");
    }
    // A token with a space is refused without being echoed.
    let e = resolve(o.clone(), &with(&[("SENTINEL_API_TOKEN", "sec ret")])).unwrap_err();
    assert!(
        e.contains("SENTINEL_API_TOKEN") && !e.contains("sec ret"),
        "{e}"
    );
    // Opt-ins: flag, variable, file.
    assert!(
        resolve(opts(&["--share-identity", "--", "true"]), &|_| None)
            .unwrap()
            .share_identity
    );
    assert!(
        resolve(o.clone(), &with(&[("TRACKER_DISCOVER", "yes")]))
            .unwrap()
            .discover
    );
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.into())
}

/// The Rust sibling's switches: flag > environment > file > default, and bad
/// values named by where they came from.
#[test]
fn renice_steal_and_quiet_layers() {
    let p = tmp(
        "sib",
        "[tracker]\nrenice = 5\naggregate_cpu_steal = false\nquiet = true\n",
    );
    let c = p.to_str().unwrap();
    let s = resolve(opts(&["-c", "/dev/null"]), &no_env).unwrap();
    assert_eq!(
        (s.renice, s.aggregate_cpu_steal, s.quiet),
        (None, true, false)
    );
    let s = resolve(opts(&["-c", c]), &no_env).unwrap();
    assert_eq!(
        (s.renice, s.aggregate_cpu_steal, s.quiet),
        (Some(5), false, true)
    );
    let env = env_of(&[
        ("TRACKER_RENICE", "7"),
        ("TRACKER_AGGREGATE_CPU_STEAL", "true"),
        ("TRACKER_QUIET", "false"),
    ]);
    let s = resolve(opts(&["-c", c]), &env).unwrap();
    assert_eq!(
        (s.renice, s.aggregate_cpu_steal, s.quiet),
        (Some(7), true, false)
    );
    let s = resolve(
        opts(&["-c", c, "-r", "--aggregate-cpu-steal", "false", "-q"]),
        &env,
    )
    .unwrap();
    assert_eq!(
        (s.renice, s.aggregate_cpu_steal, s.quiet),
        (Some(19), false, true)
    );
    let s = resolve(opts(&["-r", "-5"]), &no_env).unwrap();
    assert_eq!(s.renice, Some(-5));
    // Bad values, each named.
    assert!(Cli::try_parse_from(["rt", "-r", "20"]).is_err());
    assert!(Cli::try_parse_from(["rt", "--aggregate-cpu-steal", "maybe"]).is_err());
    for (pairs, name) in [
        (&[("TRACKER_RENICE", "-21")][..], "TRACKER_RENICE"),
        (&[("TRACKER_RENICE", "low")][..], "TRACKER_RENICE"),
        (
            &[("TRACKER_AGGREGATE_CPU_STEAL", "maybe")][..],
            "TRACKER_AGGREGATE_CPU_STEAL",
        ),
        (&[("TRACKER_QUIET", "2")][..], "TRACKER_QUIET"),
    ] {
        let e = resolve(opts(&[]), &env_of(pairs)).unwrap_err();
        assert!(e.contains(name), "{e}");
    }
    let p = tmp("sib2", "[tracker]\nrenice = 40\n");
    let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
    assert!(e.contains("[tracker] renice"), "{e}");
    // -n is --job-name.
    let s = resolve(opts(&["-n", "short"]), &no_env).unwrap();
    assert_eq!(s.meta.job_name.as_deref(), Some("short"));
}

/// SENTINEL_API_KEY (the streaming overview's name) is the token's alias; the
/// token wins; an empty token falls through to the key.
#[test]
fn sentinel_api_key_is_an_alias() {
    let token = |s: &Settings| s.sentinel.as_ref().map(|c| c.token.0.clone());
    let s = resolve(opts(&[]), &env_of(&[("SENTINEL_API_KEY", "k")])).unwrap();
    assert_eq!(token(&s).as_deref(), Some("k"));
    let both = env_of(&[("SENTINEL_API_KEY", "k"), ("SENTINEL_API_TOKEN", "t")]);
    assert_eq!(
        token(&resolve(opts(&[]), &both).unwrap()).as_deref(),
        Some("t")
    );
    for blank in ["", "  "] {
        let empty = env_of(&[("SENTINEL_API_KEY", "k"), ("SENTINEL_API_TOKEN", blank)]);
        assert_eq!(
            token(&resolve(opts(&[]), &empty).unwrap()).as_deref(),
            Some("k")
        );
    }
    let e = resolve(opts(&[]), &env_of(&[("SENTINEL_API_KEY", "a b")])).unwrap_err();
    assert!(e.contains("SENTINEL_API_KEY") && !e.contains("a b"), "{e}");
}

/// One descriptor named by both starter pipes is refused: the ready line closes
/// it, and the children's account would then read whatever reused the number.
#[test]
fn the_same_fd_for_both_starter_pipes_is_refused() {
    let o = opts(&["-c", "/dev/null"]);
    let env = env_of(&[("TRACKER_READY_FD", "5"), ("TRACKER_ROOT_CHILDREN_FD", "5")]);
    let e = resolve(o.clone(), &env).unwrap_err();
    assert!(
        e.contains("TRACKER_READY_FD") && e.contains("TRACKER_ROOT_CHILDREN_FD") && e.contains('5'),
        "{e}"
    );
    let env = env_of(&[("TRACKER_READY_FD", "5"), ("TRACKER_ROOT_CHILDREN_FD", "6")]);
    let s = resolve(o, &env).unwrap();
    assert_eq!((s.ready_fd, s.root_children_fd), (Some(5), Some(6)));
}

/// `run` tracks the command it starts: its help does not offer `--pid`, which it
/// refuses; the top level, which attaches, does.
#[test]
fn run_help_does_not_offer_pid() {
    let mut top = Cli::command();
    let top_help = top.render_long_help().to_string();
    assert!(top_help.contains("--pid"), "{top_help}");
    let run = top.find_subcommand_mut("run").expect("the run subcommand");
    let run_help = run.render_long_help().to_string();
    assert!(!run_help.contains("--pid"), "{run_help}");
    assert!(run_help.contains("--interval"), "{run_help}");
}
