//! Builds the eBPF object (tracker-ebpf) with the nightly toolchain and bpf-linker,
//! through aya-build. `scripts/setup.sh` installs both.
use object::build::elf::SectionData;

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
    )?;
    let object = std::path::Path::new(&std::env::var("OUT_DIR")?).join("tracker");
    // None with AYA_BUILD_SKIP set.
    if !object.exists() {
        return Ok(());
    }
    strip_dwarf(&object).map_err(|e| anyhow::anyhow!("stripping {}: {e:#}", object.display()))
}

/// Drops the object's DWARF and its relocations. bpf-linker needs the debug info to
/// write the BTF (`debug = 2` for tracker-ebpf), but nothing reads it after that:
/// the kernel and aya take the BTF. aya's loader parses every section's relocations
/// at each start, ~13k of them in the DWARF: 0.3–0.6 ms of a 2-vCPU start
/// (docs/cost.md).
fn strip_dwarf(path: &std::path::Path) -> anyhow::Result<()> {
    let data = std::fs::read(path)?;
    let mut elf = object::build::elf::Builder::read(&*data)?;
    let dwarf: Vec<_> = elf
        .sections
        .iter()
        .filter(|s| s.name.starts_with(b".debug_"))
        .map(|s| s.id())
        .collect();
    for s in elf.sections.iter_mut() {
        let of_dwarf = s.sh_info_section.is_some_and(|t| dwarf.contains(&t));
        if s.name.starts_with(b".debug_") || of_dwarf {
            s.delete = true;
        }
    }
    elf.delete_orphans();
    // LLVM names the sections in `.strtab`, with the symbols; the writer keeps
    // section names in a table of their own.
    if !elf
        .sections
        .iter()
        .any(|s| matches!(s.data, SectionData::SectionString))
    {
        let names = elf.sections.add();
        names.name = b".shstrtab"[..].into();
        names.sh_type = object::elf::SHT_STRTAB;
        names.sh_addralign = 1;
        names.data = SectionData::SectionString;
    }
    let mut out = Vec::new();
    elf.write(&mut out)?;
    std::fs::write(path, out)?;
    Ok(())
}
