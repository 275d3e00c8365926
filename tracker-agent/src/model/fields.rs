//! The field registry: each of the tree's per-sample fields is defined once, in
//! `sample.rs` (`tree_fields!`), and that one definition gives its JSON key and type
//! (the struct serde writes), its CSV column, its text in docs/schema.md, and how a
//! recorded file's value is read back; the Python package's tables take every field
//! of the JSON that fills none of the 0.5.0 columns (`python_csv`) as a column.
//! The writers and readers iterate the registry; none lists the fields by hand.
//! This module is the registry's machinery, generic over the struct it describes;
//! the fields themselves are in `sample.rs`.

#[cfg(test)]
use std::fmt::Write as _;

use serde_json::Value;

/// One value of a field, as the writers and the readers of recorded files see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell<'a> {
    Null,
    Num(f64),
    Int(u64),
    Text(&'a str),
    Flag(bool),
}

impl<'a> Cell<'a> {
    /// A JSON value as a cell; None for arrays and objects.
    pub fn of_json(v: &'a Value) -> Option<Cell<'a>> {
        Some(match v {
            Value::Null => Cell::Null,
            Value::Bool(b) => Cell::Flag(*b),
            Value::String(s) => Cell::Text(s),
            Value::Number(n) => match n.as_u64() {
                Some(i) => Cell::Int(i),
                None => Cell::Num(n.as_f64()?),
            },
            Value::Array(_) | Value::Object(_) => return None,
        })
    }

    /// A CSV cell as written by `csv_text`: empty is null; a number, `true` or
    /// `false`, else text.
    pub fn of_csv(c: &'a str) -> Cell<'a> {
        let c = c.trim();
        match c {
            "" => Cell::Null,
            "true" => Cell::Flag(true),
            "false" => Cell::Flag(false),
            _ => match c.parse::<u64>() {
                Ok(i) => Cell::Int(i),
                Err(_) => match c.parse::<f64>() {
                    Ok(v) if v.is_finite() => Cell::Num(v),
                    _ => Cell::Text(c),
                },
            },
        }
    }
}

/// A Rust type a field may have, and how its values are written and read back.
pub trait FieldType: Sized {
    /// The type column of docs/schema.md.
    fn schema_type() -> String;
    fn cell(&self) -> Cell<'_>;
    /// The value a recorded cell stands for; None when the cell is not one of this
    /// type. `names` are the texts a text field may hold.
    fn from_cell(c: Cell, names: &[&'static str]) -> Option<Self>;
}

impl FieldType for f64 {
    fn schema_type() -> String {
        "number".into()
    }
    fn cell(&self) -> Cell<'_> {
        Cell::Num(*self)
    }
    fn from_cell(c: Cell, _: &[&'static str]) -> Option<f64> {
        match c {
            Cell::Num(v) => Some(v),
            Cell::Int(i) => Some(i as f64),
            _ => None,
        }
    }
}

/// Integers read back from a number as the recorded readers always have: negative
/// and fractional values clamp, as a float cast does.
fn whole(c: Cell) -> Option<u64> {
    match c {
        Cell::Int(i) => Some(i),
        Cell::Num(v) if v.is_finite() => Some(v.max(0.0) as u64),
        _ => None,
    }
}

impl FieldType for u64 {
    fn schema_type() -> String {
        "integer".into()
    }
    fn cell(&self) -> Cell<'_> {
        Cell::Int(*self)
    }
    fn from_cell(c: Cell, _: &[&'static str]) -> Option<u64> {
        whole(c)
    }
}

impl FieldType for u32 {
    fn schema_type() -> String {
        "integer".into()
    }
    fn cell(&self) -> Cell<'_> {
        Cell::Int(u64::from(*self))
    }
    fn from_cell(c: Cell, _: &[&'static str]) -> Option<u32> {
        whole(c).and_then(|i| u32::try_from(i).ok())
    }
}

impl FieldType for bool {
    fn schema_type() -> String {
        "boolean".into()
    }
    fn cell(&self) -> Cell<'_> {
        Cell::Flag(*self)
    }
    fn from_cell(c: Cell, _: &[&'static str]) -> Option<bool> {
        match c {
            Cell::Flag(b) => Some(b),
            _ => None,
        }
    }
}

impl FieldType for &'static str {
    fn schema_type() -> String {
        "string".into()
    }
    fn cell(&self) -> Cell<'_> {
        Cell::Text(self)
    }
    fn from_cell(c: Cell, names: &[&'static str]) -> Option<&'static str> {
        match c {
            Cell::Text(t) => names.iter().find(|n| **n == t).copied(),
            _ => None,
        }
    }
}

impl<T: FieldType> FieldType for Option<T> {
    fn schema_type() -> String {
        format!("{}/null", T::schema_type())
    }
    fn cell(&self) -> Cell<'_> {
        self.as_ref().map_or(Cell::Null, T::cell)
    }
    fn from_cell(c: Cell, names: &[&'static str]) -> Option<Option<T>> {
        match c {
            Cell::Null => Some(None),
            c => T::from_cell(c, names).map(Some),
        }
    }
}

/// One field of a struct the registry describes (`S`: the tree's `ProcessSample`).
pub struct TreeField<S: 'static> {
    /// The key under `process`; the CSV column is `process_` and this.
    pub name: &'static str,
    pub unit: &'static str,
    /// Its line in docs/schema.md: the field's doc comment. Read by the tests that
    /// keep docs/schema.md in step (`check_block`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub doc: &'static str,
    /// Its place among our CSV columns of the tree (1 first); None: not one.
    pub csv: Option<u8>,
    /// The Python package's CSV column (its first 32) this field is read back from;
    /// the writer of those frozen columns is csv.rs's own.
    pub python_csv: Option<&'static str>,
    /// The texts a text field may hold.
    pub names: &'static [&'static str],
    /// The OTLP metric it is exported as (docs/otlp.md); None: not one.
    pub otlp: Option<Otlp>,
    pub ty: fn() -> String,
    pub get: for<'a> fn(&'a S) -> Cell<'a>,
    /// Sets the field from a recorded cell; false when the cell is not of its type.
    pub put: fn(&mut S, Cell, &'static [&'static str]) -> bool,
}

impl<S> TreeField<S> {
    /// Defaults of the optional parts, for `tree_fields!`.
    pub const NONE: TreeField<S> = TreeField {
        name: "",
        unit: "",
        doc: "",
        csv: None,
        python_csv: None,
        names: &[],
        otlp: None,
        ty: String::new,
        get: |_| Cell::Null,
        put: |_, _, _| false,
    };

    /// Decimals in CSV: µs for seconds, else four.
    pub fn decimals(&self) -> usize {
        if self.unit == "s" {
            6
        } else {
            4
        }
    }

    /// The doc comment's lines as one line of text.
    #[cfg(test)]
    pub fn text(&self) -> String {
        self.doc.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// Sets this field of `p` from a recorded cell; an error names the field.
    pub fn read(&self, p: &mut S, c: Cell, origin: &str) -> Result<(), String> {
        if (self.put)(p, c, self.names) {
            return Ok(());
        }
        let shown = match c {
            Cell::Text(t) => format!("'{}'", t.escape_debug()),
            Cell::Num(v) => v.to_string(),
            Cell::Int(i) => i.to_string(),
            Cell::Flag(b) => b.to_string(),
            Cell::Null => "null".into(),
        };
        let ty = (self.ty)();
        let want = if !self.names.is_empty() {
            format!("one of {}", self.names.join(", "))
        } else if ty.starts_with("boolean") {
            "true or false".to_string()
        } else {
            "a number".to_string()
        };
        Err(format!("{origin}: {shown} is not {want}"))
    }
}

/// The fields of `all` that are CSV columns of ours, in column order.
pub fn csv_fields<S>(all: &'static [TreeField<S>]) -> Vec<&'static TreeField<S>> {
    let mut v: Vec<&TreeField<S>> = all.iter().filter(|f| f.csv.is_some()).collect();
    v.sort_by_key(|f| f.csv);
    v
}

/// The CSV header names of `csv_fields`: `{prefix}_{name}`.
pub fn csv_columns<S>(prefix: &str, all: &'static [TreeField<S>]) -> Vec<String> {
    csv_fields(all)
        .iter()
        .map(|f| format!("{prefix}_{}", f.name))
        .collect()
}

/// A Markdown table row; an empty cell is `| |`, as the docs write it.
#[cfg(test)]
fn table_row(cells: &[&str]) -> String {
    let mut s = String::from("|");
    for c in cells {
        if c.is_empty() {
            s.push_str(" |");
        } else {
            let _ = write!(s, " {c} |");
        }
    }
    s
}

/// docs/schema.md's rows of the JSON fields of `all`, under `prefix`.
#[cfg(test)]
pub fn schema_rows<S>(prefix: &str, all: &'static [TreeField<S>]) -> String {
    let mut s = String::new();
    for f in all {
        let name = format!("`{prefix}.{}`", f.name);
        let _ = writeln!(s, "{}", table_row(&[&name, &(f.ty)(), f.unit, &f.text()]));
    }
    s
}

/// docs/schema.md's rows of our CSV columns of `all` (per-interval bytes, as every
/// byte count of the tree is).
#[cfg(test)]
pub fn csv_schema_rows<S>(prefix: &str, all: &'static [TreeField<S>]) -> String {
    let mut s = String::new();
    for f in csv_fields(all) {
        let unit = if f.unit == "bytes" {
            "bytes in the interval"
        } else {
            f.unit
        };
        let (col, json) = (
            format!("`{prefix}_{}`", f.name),
            format!("`{prefix}.{}`", f.name),
        );
        let _ = writeln!(s, "{}", table_row(&[&col, unit, &json, ""]));
    }
    s
}

/// The workspace file `rel` (from the agent's crate) against `want` within the
/// block of lines of `section` that `is_row` picks (the last run of them with
/// `last`); with TRACKER_BLESS=1 the block is written instead. For the tests that
/// keep generated text in step.
#[cfg(test)]
pub fn check_block(rel: &str, section: &str, is_row: fn(&str) -> bool, last: bool, want: &str) {
    let path = format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    let lines: Vec<&str> = doc.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(section))
        .unwrap_or_else(|| panic!("{rel} has no {section}"));
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |e| start + 1 + e);
    let mut runs = Vec::new();
    let mut i = start;
    while i < end {
        if is_row(lines[i]) {
            let j = (i..end).find(|&j| !is_row(lines[j])).unwrap_or(end);
            runs.push((i, j));
            i = j;
        } else {
            i += 1;
        }
    }
    let (a, b) = if last { runs.last() } else { runs.first() }
        .copied()
        .unwrap_or_else(|| panic!("{rel} ({section}) has no such rows"));
    let got: String = lines[a..b].iter().map(|l| format!("{l}\n")).collect();
    if got == want {
        return;
    }
    if std::env::var_os("TRACKER_BLESS").is_some() {
        let mut out: Vec<&str> = lines[..a].to_vec();
        out.extend(want.lines());
        out.extend(&lines[b..]);
        std::fs::write(&path, out.join("\n") + "\n").expect("writing the doc");
        return;
    }
    panic!("{rel} ({section}) is not the registry's; TRACKER_BLESS=1 writes it:\n{want}");
}

// The OTLP metric of a field: model/otlp.rs makes points of them.

/// How a field becomes a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A value now (OTLP Gauge).
    Gauge,
    /// Already a total since the start (a cumulative, monotonic Sum).
    Total,
    /// The growth over the interval: added up here into a cumulative Sum.
    Growth,
}

/// A field's OTLP metric: its name (the semantic conventions' where they have
/// one, else under `resource_tracker.`), unit (UCUM, as the conventions write
/// it), the factor from the field's unit, its kind and fixed attributes.
#[derive(Clone, Copy, Debug)]
pub struct Otlp {
    pub name: &'static str,
    pub unit: &'static str,
    pub scale: f64,
    pub kind: Kind,
    pub attrs: &'static [(&'static str, &'static str)],
}

pub const MIB: f64 = 1_048_576.0;

impl Otlp {
    pub const fn new(name: &'static str, unit: &'static str, kind: Kind) -> Otlp {
        Otlp {
            name,
            unit,
            scale: 1.0,
            kind,
            attrs: &[],
        }
    }
    /// A figure in MiB, exported in bytes.
    pub const fn mib(name: &'static str, kind: Kind) -> Otlp {
        Otlp {
            scale: MIB,
            ..Otlp::new(name, "By", kind)
        }
    }
    pub const fn with(self, attrs: &'static [(&'static str, &'static str)]) -> Otlp {
        Otlp { attrs, ..self }
    }
}

/// Defines `ProcessSample` (its fields in JSON order, each with its doc comment,
/// the line docs/schema.md shows) and `TREE_FIELDS`, the registry, from one list:
/// `name: Type { unit: …, csv: Some(n), python_csv: Some(…), names: … }`; a field
/// that is a kernel figure's growth over the interval says which after its type
/// (`name: u64 = per_interval(figure) { … }`), and `set_interval` fills it.
macro_rules! tree_fields {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty $(= per_interval($fig:ident))? { $($key:ident: $val:expr),* $(,)? }
    )*) => {
        /// The tracked tree in one sample (`process`).
        #[derive(Clone, Debug, Default, Serialize)]
        pub struct ProcessSample {
            $( $(#[doc = $doc])* pub $name: $ty, )*
        }

        impl ProcessSample {
            /// Sets each field given as `= per_interval(figure)`: that figure of
            /// the tree's (`tracker_common::Figures`), its growth over the interval.
            pub fn set_interval(&mut self, d: &::tracker_common::Figures) {
                $( $( self.$name = d.$fig; )? )*
            }
        }

        /// The tree's fields, in the order of its JSON object.
        pub const TREE_FIELDS: &[$crate::model::fields::TreeField<ProcessSample>] = &[$(
            $crate::model::fields::TreeField {
                name: stringify!($name),
                doc: concat!($($doc, "\n"),*),
                ty: <$ty as $crate::model::fields::FieldType>::schema_type,
                get: |p| $crate::model::fields::FieldType::cell(&p.$name),
                put: |p, c, names| {
                    match <$ty as $crate::model::fields::FieldType>::from_cell(c, names) {
                        Some(v) => {
                            p.$name = v;
                            true
                        }
                        None => false,
                    }
                },
                $($key: $val,)*
                ..$crate::model::fields::TreeField::NONE
            },
        )*];
    };
}
pub(crate) use tree_fields;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_cells_read_as_written() {
        assert_eq!(Cell::of_csv(""), Cell::Null);
        assert_eq!(Cell::of_csv("12"), Cell::Int(12));
        assert_eq!(Cell::of_csv("1.5"), Cell::Num(1.5));
        assert_eq!(Cell::of_csv("true"), Cell::Flag(true));
        assert_eq!(Cell::of_csv("ebpf"), Cell::Text("ebpf"));
        assert_eq!(Cell::of_csv("1e400"), Cell::Text("1e400"));
        assert_eq!(Cell::of_csv("NaN"), Cell::Text("NaN"));
        assert_eq!(u64::from_cell(Cell::Num(-3.0), &[]), Some(0));
        assert_eq!(<Option<f64>>::from_cell(Cell::Null, &[]), Some(None));
        assert_eq!(<&str>::from_cell(Cell::Text("x"), &["y"]), None);
        assert_eq!(<Option<u64>>::schema_type(), "integer/null");
    }
}
