//! Host-wide collectors, one module per source. Each keeps its previous reading so
//! that rates are deltas over the measured elapsed time between two readings.
//! A source that cannot be read makes its fields null with one warning per field
//! for the whole run (see `crate::warn`), never an error.

pub mod cgroup;
pub mod containers;
pub mod cpu;
pub mod disk;
pub mod files;
pub mod gpu;
pub mod host;
pub mod limits;
pub mod memcg;
pub mod memory;
pub mod mountinfo;
pub mod network;
pub mod system;

pub use files::Roots;
pub use system::SystemCollector;

#[cfg(test)]
pub(crate) mod testroot {
    //! Temporary /proc and /sys trees laid out by tests.

    use std::{
        path::{Path, PathBuf},
        sync::atomic::{AtomicUsize, Ordering},
    };

    use super::Roots;

    static NEXT: AtomicUsize = AtomicUsize::new(0);

    /// Removed on drop.
    pub(crate) struct TestRoot {
        pub dir: PathBuf,
    }

    impl TestRoot {
        pub(crate) fn new(name: &str) -> TestRoot {
            let dir = std::env::temp_dir().join(format!(
                "collect-{name}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("proc")).unwrap();
            std::fs::create_dir_all(dir.join("sys")).unwrap();
            TestRoot { dir }
        }

        pub(crate) fn roots(&self) -> Roots {
            Roots {
                proc: self.dir.join("proc"),
                sys: self.dir.join("sys"),
            }
        }

        pub(crate) fn path(&self, rel: &str) -> PathBuf {
            self.dir.join(rel)
        }

        /// Writes `rel` (relative to the tree, e.g. `proc/stat`), creating parents.
        pub(crate) fn write(&self, rel: &str, content: &str) {
            let p = self.dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }

        pub(crate) fn mkdir(&self, rel: &str) {
            std::fs::create_dir_all(self.dir.join(rel)).unwrap();
        }

        /// A symlink at `rel` pointing to `target` (relative, as sysfs has them).
        pub(crate) fn symlink(&self, rel: &str, target: &str) {
            let p = self.dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(&p);
            std::os::unix::fs::symlink(Path::new(target), p).unwrap();
        }

        pub(crate) fn remove(&self, rel: &str) {
            let p = self.dir.join(rel);
            if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(p).unwrap();
            } else {
                std::fs::remove_file(p).unwrap();
            }
        }
    }

    impl Drop for TestRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
