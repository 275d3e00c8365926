//! Link arguments of the eBPF object.
fn main() {
    // A function the link exports keeps its global linkage in the object's BTF,
    // and the kernel's verifier then checks it once on its own (a "global
    // function") rather than at every call (tracker-ebpf/src/main.rs: probe_member,
    // retire_displaced_key, add_child, move_exec_entry, adopt, adopt_children).
    println!("cargo:rustc-link-arg-bins=--export=probe_member,retire_displaced_key,add_child,move_exec_entry,adopt,adopt_children");
}
