//! Warnings that would otherwise repeat every sample (a /proc file missing on an
//! unusual kernel, say) are printed once per key for the whole run.

use std::{collections::HashSet, io::Write, sync::Mutex};

/// An error with its causes on one line ("error sending request: connection
/// refused"), each cause said once.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

/// One line to the user on stderr. A closed or full stderr loses the line but
/// never ends the run (`eprintln!` would panic).
pub fn say(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "resource-tracker: {msg}");
}

static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Logs `msg` as a warning the first time `key` is seen; returns whether it did.
pub fn warn_once(key: &str, msg: impl std::fmt::Display) -> bool {
    let mut g = match SEEN.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let seen = g.get_or_insert_with(HashSet::new);
    if seen.contains(key) {
        return false;
    }
    seen.insert(key.to_string());
    log::warn!("{msg}");
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn once_per_key() {
        assert!(super::warn_once("t.a", "a"));
        assert!(!super::warn_once("t.a", "a"));
        assert!(super::warn_once("t.b", "b"));
    }
}

/// Text from outside (a path, a value) fit for one line: control characters are
/// shown escaped (`\n`, `\u{1b}`), so a name cannot split or forge a line.
pub fn escaped(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}
