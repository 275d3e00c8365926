//! A share in percent, as both GPU collectors give their figures.

/// `part` of `whole` in percent; None when `whole` is 0.
pub(super) fn pct(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64 * 100.0)
}
