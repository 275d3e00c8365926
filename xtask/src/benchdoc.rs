//! docs/benchmarks.md, one section per bench mode: each mode finds and replaces
//! its own section (from its `## ` heading to the next), so a mode run alone keeps
//! the others'.

use std::path::Path;

use anyhow::Context as _;

/// The first line of the peers section (see peers.rs).
pub const PEERS_MARK: &str = "## Peers, side by side";

/// The section of `doc` that starts at `mark`, up to the next `## ` heading.
pub fn doc_section<'a>(doc: &'a str, mark: &str) -> Option<&'a str> {
    let start = doc.find(mark)?;
    let rest = &doc[start + mark.len()..];
    let end = rest
        .find("\n## ")
        .map_or(doc.len(), |i| start + mark.len() + i + 1);
    Some(&doc[start..end])
}

/// Replaces the section at `mark` of the file at `path` with `md`, or adds it
/// before the peers' section (which `bench --only-peers` rewrites).
pub fn write_section(path: &Path, mark: &str, md: &str) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let text = match doc_section(&old, mark) {
        // A section followed by another keeps the blank line before its heading.
        Some(s) if s.len() < old.len() - old.find(mark).unwrap_or(0) => {
            old.replacen(s, &format!("{}\n\n", md.trim_end()), 1)
        }
        Some(s) => old.replacen(s, &format!("{}\n", md.trim_end()), 1),
        None => match old.find(PEERS_MARK) {
            Some(i) => format!("{}{}\n\n{}", &old[..i], md.trim_end(), &old[i..]),
            None => format!("{}\n\n{}\n", old.trim_end(), md.trim_end()),
        },
    };
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
