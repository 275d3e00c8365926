//! The release binaries link against glibc 2.17 (manylinux2014, `cargo xtask wheel
//! --release`), which `cargo xtask test` does not build: the suite's binaries link
//! against this machine's glibc and would take a newer wrapper without a word. The
//! agent's own code therefore calls no libc function that glibc added after 2.17
//! (it goes through `libc::syscall` instead); this test reads the calls from the
//! code. Dependencies are checked by the release build itself.

mod tests {
    /// Functions glibc added after 2.17, with the version that added them.
    const NEWER: [(&str, &str); 22] = [
        ("memfd_create", "2.27"),
        ("gettid", "2.30"),
        ("statx", "2.28"),
        ("copy_file_range", "2.27"),
        ("getrandom", "2.25"),
        ("getentropy", "2.25"),
        ("explicit_bzero", "2.25"),
        ("reallocarray", "2.26"),
        ("preadv2", "2.26"),
        ("pwritev2", "2.26"),
        ("mlock2", "2.27"),
        ("pkey_alloc", "2.27"),
        ("renameat2", "2.28"),
        ("fcntl64", "2.28"),
        ("tgkill", "2.30"),
        ("close_range", "2.34"),
        ("epoll_pwait2", "2.35"),
        ("pidfd_open", "2.36"),
        ("pidfd_send_signal", "2.36"),
        ("pidfd_getfd", "2.36"),
        ("arc4random", "2.36"),
        ("strlcpy", "2.38"),
    ];

    /// `libc::NAME(` calls in the non-test code under `dir`, as (file, name).
    fn calls(dir: &std::path::Path) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for p in crate::layout::rs_files(dir).unwrap() {
            let code = crate::layout::code(&std::fs::read_to_string(&p).unwrap());
            let mut rest = code.as_str();
            while let Some(i) = rest.find("libc::") {
                rest = &rest[i + "libc::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if rest[name.len()..].starts_with('(') {
                    found.push((p.display().to_string(), name));
                }
            }
        }
        found
    }

    #[test]
    fn the_agent_calls_no_libc_function_newer_than_glibc_2_17() {
        let got = calls(&crate::root().join("tracker-agent/src"));
        assert!(
            got.iter().any(|(_, n)| n == "syscall"),
            "the scan reads calls: {got:?}"
        );
        let newer: Vec<String> = got
            .iter()
            .filter_map(|(f, n)| {
                let (_, v) = NEWER.iter().find(|(x, _)| x == n)?;
                Some(format!("{f}: libc::{n} (glibc {v})"))
            })
            .collect();
        assert!(
            newer.is_empty(),
            "call these through libc::syscall: {newer:?}"
        );
    }
}
