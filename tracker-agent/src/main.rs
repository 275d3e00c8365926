//! resource-tracker: parses the command line, resolves it into one `Settings` and
//! hands that to a session; the work lives in the modules.

mod collect;
mod discovery;
mod engine;
mod fsafe;
mod model;
mod selfcost;
mod session;
mod settings;
mod sink;
mod sudo;
mod sys;
mod warn;

use clap::{
    error::{ContextKind, ContextValue},
    Parser as _,
};

fn main() {
    // Log lines carry paths and values read from outside: they reach the terminal
    // through the same escaping as every other line.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(|buf, r| {
            use std::io::Write as _;
            writeln!(
                buf,
                "[{} {:<5}] {}",
                buf.timestamp(),
                r.level(),
                warn::escaped(&r.args().to_string())
            )
        })
        .init();
    if sink::sentinel::guardian::is_guardian() {
        std::process::exit(sink::sentinel::guardian::main());
    }
    if let Some(why) = sudo::set_user_id_root() {
        warn::say(&why);
        std::process::exit(2);
    }
    let get_env = |k: &str| std::env::var_os(k);
    if let Err(e) = settings::check_flag_env(&get_env) {
        warn::say(&e);
        std::process::exit(2);
    }
    let cli = match settings::cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            clap::error::ErrorKind::InvalidUtf8 => {
                warn::say(not_utf8(std::env::args_os()));
                std::process::exit(2);
            }
            _ => {
                let mut text = e.render().to_string();
                // A value with a line break would break the one line.
                if let Some(ContextValue::String(v)) = e.get(ContextKind::InvalidValue) {
                    text = text.replace(v.as_str(), &v.escape_debug().to_string());
                }
                warn::say(format_args!("{} (see --help)", one_line(&text)));
                std::process::exit(2);
            }
        },
    };
    let job = match settings::resolve_job(cli, &get_env) {
        Ok(j) => j,
        Err(e) => {
            warn::say(&e);
            std::process::exit(2);
        }
    };
    let ran = match job {
        settings::Job::Track(st) => session::run(*st),
        settings::Job::Node(st) => session::node::run(*st),
        settings::Job::Report(st) => session::report::run(*st),
    };
    match ran {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            warn::say(format_args!("{e:#}"));
            std::process::exit(1);
        }
    }
}

/// clap's message in one line, not its usage block. A first line that announces
/// a list ("…were not provided:") takes the list's items with it.
fn one_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match first.strip_suffix(':') {
        Some(head) => {
            let items: Vec<&str> = lines.take_while(|l| !l.starts_with("Usage:")).collect();
            format!("{head}: {}", items.join(", "))
        }
        None => first.to_string(),
    }
}

/// Which argument is not UTF-8: the option it belongs to, or its position.
fn not_utf8(args: impl Iterator<Item = std::ffi::OsString>) -> String {
    let mut prev: Option<String> = None;
    for (i, a) in args.enumerate().skip(1) {
        match a.to_str() {
            Some(s) => prev = Some(s.to_string()),
            None => {
                let bytes = std::os::unix::ffi::OsStrExt::as_bytes(a.as_os_str());
                let inline = bytes
                    .starts_with(b"-")
                    .then(|| bytes.split(|b| *b == b'=').next())
                    .flatten()
                    .and_then(|f| std::str::from_utf8(f).ok())
                    .filter(|f| f.len() < bytes.len());
                return match (
                    inline.map(str::to_string),
                    prev.filter(|p| p.starts_with('-') && p != "--"),
                ) {
                    (Some(flag), _) | (None, Some(flag)) => {
                        format!("{flag}: the value is not valid UTF-8")
                    }
                    (None, None) => format!("argument {i} is not valid UTF-8"),
                };
            }
        }
    }
    "an argument is not valid UTF-8".into()
}

#[cfg(test)]
mod tests {
    use std::{ffi::OsString, os::unix::ffi::OsStringExt};

    #[test]
    fn one_line_names_what_is_missing() {
        let t = "error: the following required arguments were not provided:\n  <COMMAND>...\n\nUsage: resource-tracker run <COMMAND>...\n";
        assert_eq!(
            super::one_line(t),
            "the following required arguments were not provided: <COMMAND>..."
        );
        assert_eq!(
            super::one_line("error: unexpected argument '--x' found\n\n  tip: x\n"),
            "unexpected argument '--x' found"
        );
    }

    #[test]
    fn not_utf8_names_the_option() {
        let bad = || OsString::from_vec(vec![b'a', 0xff]);
        let args = |v: Vec<OsString>| v.into_iter();
        let s = |x: &str| OsString::from(x);
        assert_eq!(
            super::not_utf8(args(vec![s("rt"), s("run"), s("--tag"), bad()])),
            "--tag: the value is not valid UTF-8"
        );
        let mut inline = b"--job-name=".to_vec();
        inline.push(0xff);
        assert_eq!(
            super::not_utf8(args(vec![s("rt"), OsString::from_vec(inline)])),
            "--job-name: the value is not valid UTF-8"
        );
        assert_eq!(
            super::not_utf8(args(vec![s("rt"), s("run"), s("--"), bad()])),
            "argument 3 is not valid UTF-8"
        );
    }
}
