//! Builds the eBPF object (tracker-ebpf) with the nightly toolchain and bpf-linker,
//! through aya-build. `scripts/setup.sh` installs both.
fn main() -> anyhow::Result<()> {
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
