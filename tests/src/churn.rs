//! Unrelated work on the host beside a tracked workload, in a cgroup of its own:
//! shell loops forking short-lived `/bin/true` and `grep` (pid churn: the host's
//! pids come round while the tree runs) and a loop of short CPU-heavy processes.
//! Nothing of it belongs to the tracked tree; a tracker that takes any of it for a
//! member shows it in its figures or its events.

use std::process::{Child, Command, Stdio};

use crate::{workload, Cgroup};

pub struct Churn {
    cg: Cgroup,
    kids: Vec<Child>,
}

impl Churn {
    pub fn start(tag: &str) -> Churn {
        let cg = Cgroup::new(&format!("churn-{tag}"));
        let w = workload();
        let forks = "while :; do /bin/true; grep -q x /etc/hostname; done";
        let cpu = format!("while :; do {} spin 3000 >/dev/null; done", w.display());
        let kids = [forks, forks, cpu.as_str()]
            .iter()
            .map(|script| {
                Command::new(&w)
                    .arg("incgroup")
                    .arg(cg.join_arg())
                    .args(["--", "/bin/sh", "-c", script])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot start the churn: {e}"))
            })
            .collect();
        Churn { cg, kids }
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        // The loops fork as they are killed: until the group is empty.
        for _ in 0..200 {
            self.cg.kill_all();
            if self.cg.procs() == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        for k in &mut self.kids {
            let _ = k.wait();
        }
    }
}
