//! The agent's imports as its code has them: which top-level module of
//! tracker-agent/src uses which, read from the `crate::` paths of its non-test code
//! (the crate root names modules without the prefix). docs/layout.md lists them with
//! the rule each follows, and a test holds the two together and the graph free of
//! circles.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// Top-level module → the other top-level modules its code imports.
pub type Imports = BTreeMap<String, BTreeSet<String>>;

/// The module a file under `src` belongs to: its first path component, without `.rs`.
fn module_of(rel: &Path) -> String {
    let first = rel.components().next().map_or_else(String::new, |c| {
        c.as_os_str().to_string_lossy().into_owned()
    });
    first.trim_end_matches(".rs").to_string()
}

/// The names a use-tree list `a::{b, c}, d` starts with, at its top level: module
/// names (lower case).
fn heads(list: &str) -> Vec<String> {
    heads_by(list, |c| c.is_ascii_lowercase() || c == '_')
}

/// The names of any case a use-tree list starts with.
fn heads_any(list: &str) -> Vec<String> {
    heads_by(list, |c| c.is_alphanumeric() || c == '_')
}

/// The names a use-tree list starts with, at its top level, made of `name` chars.
fn heads_by(list: &str, name: fn(char) -> bool) -> Vec<String> {
    let (mut depth, mut cur, mut out) = (0, String::new(), Vec::new());
    for ch in list.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out.push(cur);
    out.iter()
        .filter_map(|s| {
            let s = s.trim();
            let end = s.find(|c: char| !name(c)).unwrap_or(s.len());
            (end > 0).then(|| s[..end].to_string())
        })
        .collect()
}

/// Code before its test module (`#[cfg(test)]` then `mod …tests`), comments
/// dropped.
pub fn code(text: &str) -> String {
    let mut end = text.len();
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]") {
        let at = from + i;
        let next = text[at..].lines().nth(1).unwrap_or("").trim_start();
        if next.starts_with("mod ") && next.contains("tests") {
            end = at;
            break;
        }
        from = at + 1;
    }
    text[..end]
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `.rs` file under `dir`.
pub fn rs_files(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    Ok(files)
}

/// The imports of the crate whose sources are in `src`.
pub fn imports(src: &Path) -> std::io::Result<Imports> {
    let files = rs_files(src)?;
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|p| p.strip_prefix(src).ok())
        .map(module_of)
        .filter(|m| m != "main")
        .collect();
    let mut out = Imports::new();
    for p in &files {
        let Ok(rel) = p.strip_prefix(src) else {
            continue;
        };
        let from = module_of(rel);
        let text = code(&std::fs::read_to_string(p)?);
        let mut used = BTreeSet::new();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let list = match rest.strip_prefix('{') {
                Some(r) => &r[..r.find("};").unwrap_or(r.len())],
                None => rest
                    .split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .next()
                    .unwrap_or(""),
            };
            used.extend(heads(list));
        }
        if from == "main" {
            for m in &modules {
                if text.contains(&format!("{m}::")) {
                    used.insert(m.clone());
                }
            }
        }
        let entry = out.entry(from.clone()).or_default();
        entry.extend(
            used.into_iter()
                .filter(|m| *m != from && modules.contains(m)),
        );
    }
    Ok(out)
}

/// A circle of `imports`, if there is one (modules in order).
pub fn circle(imports: &Imports) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        g: &Imports,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            return Some(path[i..].to_vec());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for n in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(n, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    imports
        .keys()
        .find_map(|m| visit(m, imports, &mut Vec::new(), &mut done))
}

/// The table of docs/layout.md's "Imports" section: module → what it imports.
pub fn documented(doc: &str) -> Imports {
    documented_in(doc, "## Imports")
}

/// The table under `heading` in docs/layout.md: its first column → the names in
/// its second.
pub fn documented_in(doc: &str, heading: &str) -> Imports {
    let section = doc.split(heading).nth(1).unwrap_or("");
    let section = section.split("\n## ").next().unwrap_or("");
    let mut out = Imports::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(m), Some(uses)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let names = uses
            .split(',')
            .map(|s| s.trim().trim_matches('`').to_string())
            .filter(|s| !s.is_empty() && s != "—");
        out.insert(m.trim_matches('`').to_string(), names.collect());
    }
    out
}

/// A file of a folder of `src` (not the crate root, not a `mod.rs`): its path
/// under `src`, its folder, the names beside it (files and folders), and the
/// names it reaches through `super::` or `crate::FOLDER::` (its folder's path).
struct Child {
    rel: std::path::PathBuf,
    folder: String,
    siblings: BTreeSet<String>,
    reached: Vec<(String, String)>,
}

/// Every child file of a folder of `src`, with what it reaches in its folder.
fn children(src: &Path) -> std::io::Result<Vec<Child>> {
    let mut out = Vec::new();
    for f in rs_files(src)? {
        let Ok(rel) = f.strip_prefix(src) else {
            continue;
        };
        let Some(dir) = rel.parent().filter(|d| !d.as_os_str().is_empty()) else {
            continue;
        };
        // A folder's own `mod.rs` declares its children; `tests.rs` is test code.
        if f.file_name()
            .is_some_and(|n| n == "mod.rs" || n == "tests.rs")
        {
            continue;
        }
        let siblings: BTreeSet<String> = std::fs::read_dir(f.parent().unwrap_or(src))?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                let p = e.path();
                if p.is_dir() {
                    Some(n)
                } else {
                    n.strip_suffix(".rs").map(str::to_string)
                }
            })
            .collect();
        let folder = dir.to_string_lossy().into_owned();
        let own = format!("crate::{}::", folder.replace('/', "::"));
        let text = code(&std::fs::read_to_string(&f)?);
        let mut reached = Vec::new();
        for (prefix, is_super) in [("super::", true), (own.as_str(), false)] {
            let mut rest = text.as_str();
            while let Some(i) = rest.find(prefix) {
                // `super::super::` and `crate::a::b::` inside a longer path are
                // the prefix's own business.
                let before = &rest[..i];
                rest = &rest[i + prefix.len()..];
                if is_super && before.ends_with("::") {
                    continue;
                }
                let list = match rest.strip_prefix('{') {
                    Some(r) => &r[..r.find("};").unwrap_or(r.len())],
                    None => rest
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or(""),
                };
                for h in heads_any(list) {
                    if h != "self" && h != "super" {
                        reached.push((prefix.to_string(), h));
                    }
                }
            }
        }
        out.push(Child {
            rel: rel.to_path_buf(),
            folder,
            siblings,
            reached,
        });
    }
    Ok(out)
}

/// The names a file in a folder of `src` reaches through its parent's `mod.rs`:
/// `super::X` where `X` is no sibling module (a file or folder beside it), and
/// `crate::PATH::X` where `PATH` is its own folder. Files of the crate root and
/// `mod.rs` files themselves are not children.
pub fn upward_imports(src: &Path) -> std::io::Result<Vec<String>> {
    let mut out: Vec<String> = children(src)?
        .iter()
        .flat_map(|c| {
            c.reached
                .iter()
                .filter(|(_, h)| !c.siblings.contains(h))
                .map(|(prefix, h)| format!("{}: {prefix}{h}", c.rel.display()))
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// Inside each folder of `src`: `FOLDER/CHILD` → the siblings it imports, as
/// `FOLDER/SIBLING` (a child is a file's stem; a folder beside it is a sibling).
pub fn folder_imports(src: &Path) -> std::io::Result<Imports> {
    let mut out = Imports::new();
    for c in children(src)? {
        let stem = c
            .rel
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let entry = out.entry(format!("{}/{stem}", c.folder)).or_default();
        for (_, h) in c.reached.iter().filter(|(_, h)| c.siblings.contains(h)) {
            if *h != stem {
                entry.insert(format!("{}/{h}", c.folder));
            }
        }
    }
    Ok(out)
}

/// The most lines a function outside the tests may have.
pub const MAX_FN_LINES: usize = 100;

/// Functions of `text` (a file's code outside its test module) longer than
/// `MAX_FN_LINES`, with their first line (1-based) and length. A function runs from
/// its `fn` line to the `}` at its own indentation.
pub fn long_fns(text: &str) -> Vec<(String, usize, usize)> {
    let code = code(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let indent = l.len() - t.len();
        let mut rest = t;
        for q in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(q).unwrap_or(rest);
        }
        let Some(sig) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = sig
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The body opens where the signature ends; a declaration has none.
        let Some(open) = (i..lines.len()).find(|&j| {
            let e = lines[j].trim_end();
            e.ends_with('{') || e.ends_with(';')
        }) else {
            continue;
        };
        if lines[open].trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].trim_end() == close) {
            let n = end - i + 1;
            if n > MAX_FN_LINES {
                out.push((name, i + 1, n));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inside a folder, a file imports its siblings, never what its parent's
    /// `mod.rs` holds: what children share lives in a leaf file of its own.
    #[test]
    fn no_file_imports_its_parent() {
        let up = upward_imports(&crate::root().join("tracker-agent/src")).unwrap();
        assert!(
            up.is_empty(),
            "imports of a parent's mod.rs:\n{}",
            up.join("\n")
        );
    }

    /// No function of the agent, xtask or the tests' library and binaries is
    /// longer than `MAX_FN_LINES` (test modules aside): a long one is split where
    /// its steps are, each named.
    #[test]
    fn no_function_is_longer_than_a_hundred_lines() {
        let root = crate::root();
        let mut long = Vec::new();
        for dir in ["tracker-agent/src", "xtask/src", "tests/src"] {
            for f in rs_files(&root.join(dir)).unwrap() {
                let text = std::fs::read_to_string(&f).unwrap();
                for (name, line, n) in long_fns(&text) {
                    long.push(format!("{}:{line} {name}: {n} lines", f.display()));
                }
            }
        }
        assert!(
            long.is_empty(),
            "functions over {MAX_FN_LINES} lines:\n{}",
            long.join("\n")
        );
        let sample = format!(
            "fn short() {{\n}}\n\npub async fn long(\n    a: u32,\n) -> u32 {{\n{}    a\n}}\n",
            "    let _ = 1;\n".repeat(MAX_FN_LINES)
        );
        assert_eq!(
            long_fns(&sample),
            [("long".to_string(), 4, MAX_FN_LINES + 5)]
        );
    }

    #[test]
    fn the_agents_imports_point_one_way_as_docs_layout_says() {
        let root = crate::root();
        let got = imports(&root.join("tracker-agent/src")).unwrap();
        assert_eq!(circle(&got), None, "an import circle");
        let doc = std::fs::read_to_string(root.join("docs/layout.md")).unwrap();
        assert_eq!(
            documented(&doc),
            got,
            "docs/layout.md's Imports table differs from the code"
        );
    }

    /// Inside folders too, imports point one way, as docs/layout.md's table of
    /// them says.
    #[test]
    fn inside_folders_imports_point_one_way_as_docs_layout_says() {
        let root = crate::root();
        let got = folder_imports(&root.join("tracker-agent/src")).unwrap();
        assert_eq!(circle(&got), None, "an import circle inside a folder");
        let doc = std::fs::read_to_string(root.join("docs/layout.md")).unwrap();
        let table: Vec<String> = got
            .iter()
            .map(|(m, d)| {
                let uses: Vec<String> = d.iter().map(|x| format!("`{x}`")).collect();
                let uses = if uses.is_empty() {
                    "—".to_string()
                } else {
                    uses.join(", ")
                };
                format!("| `{m}` | {uses} |")
            })
            .collect();
        assert_eq!(
            documented_in(&doc, "## Imports inside folders"),
            got,
            "docs/layout.md's table of imports inside folders differs from the code; as the code has it:\n{}",
            table.join("\n")
        );
    }

    #[test]
    fn a_circle_is_found_and_use_lists_are_read() {
        let g = |pairs: &[(&str, &[&str])]| -> Imports {
            pairs
                .iter()
                .map(|(m, d)| (m.to_string(), d.iter().map(|s| s.to_string()).collect()))
                .collect()
        };
        assert_eq!(
            circle(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &[])])),
            None
        );
        assert_eq!(
            circle(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])])),
            Some(vec!["a".into(), "b".into(), "c".into()])
        );
        assert_eq!(
            heads(" model::{a, b::{c}}, warn::say,\n sys "),
            ["model", "warn", "sys"]
        );
    }
}
