//! A runtime of discovery's own, for the requests it makes.

/// Runs `f` on a runtime of its own. A name lookup (metadata.google.internal,
/// Keeper's host) runs on a blocking thread that cannot be cancelled: a slow
/// resolver is not waited for once `f` has given up.
pub(super) fn on_own_runtime<T>(f: impl std::future::Future<Output = T>) -> std::io::Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(f);
    rt.shutdown_background();
    Ok(out)
}
