//! Builds the eBPF object (tracker-ebpf) with the nightly toolchain and bpf-linker,
//! through aya-build. `scripts/setup.sh` installs both.
fn main() -> anyhow::Result<()> {
    // aya-build shows every line the inner cargo prints on stderr as a
    // `cargo:warning`: its progress ("Compiling …", ~50 lines on a first build) would
    // read as warnings. Quiet, the inner cargo prints only what is wrong (compiler
    // diagnostics, errors), which still reach the user that way.
    std::env::set_var("CARGO_TERM_QUIET", "true");
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let root_dir = format!("{manifest}/../tracker-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracker-ebpf",
            root_dir: &root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
