//! The Sink trait and Sinks, the output formats, and the files sinks write: what
//! every sink shares.

use std::{
    fs::File,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use crate::{
    fsafe::{self, Owner},
    model::{Sample, Summary},
    warn::say,
};

/// An output of `T`s (a run's samples, its process events, the node agent's
/// scans) that ends with `E` (the run's summary, or nothing).
pub trait Sink<T: ?Sized = Sample, E: ?Sized = Summary> {
    /// One item, as soon as it is there.
    fn write(&mut self, item: &T) -> anyhow::Result<()>;
    /// The end of the run. Sinks finish in order, and one may add to the summary
    /// what only it knows (Sentinel: how streaming went) for the sinks after it.
    fn finish(&mut self, end: &mut E) -> anyhow::Result<()>;
    /// After a failed `write` or `finish`: moves to a file of its own in a private
    /// directory and names it, so the run keeps what it can; None when the sink
    /// has nowhere else to go. The failed call is then tried once more.
    fn fall_back(&mut self) -> Option<PathBuf> {
        None
    }
    /// What the sink can no longer do as asked, as a named degradation for the
    /// samples from now on (a spool that failed, say).
    fn degraded(&self) -> Option<(&'static str, String)> {
        None
    }
    /// At the end, for a sink that stopped (nowhere to fall back to): `lost`
    /// items never reached it, the one that failed included; it may say so in
    /// the end (the samples' count in the summary).
    fn stopped(&mut self, _end: &mut E, _lost: u64) {}
}

/// The sinks of one stream in order. A failing sink never ends the run (the
/// command it tracks goes on and its exit code is kept): it is said in one line,
/// the sink falls back to a file it names or, failing that, stops.
/// A sink, whether it lives, and the items it never got once it stopped.
type Slot<T, E> = (Box<dyn Sink<T, E>>, bool, u64);

pub struct Sinks<T: ?Sized = Sample, E: ?Sized = Summary> {
    list: Vec<Slot<T, E>>,
}

impl<T: ?Sized, E: ?Sized> Sinks<T, E> {
    pub fn new(list: Vec<Box<dyn Sink<T, E>>>) -> Sinks<T, E> {
        Sinks {
            list: list.into_iter().map(|s| (s, true, 0)).collect(),
        }
    }

    pub fn write(&mut self, item: &T) {
        for (sink, live, lost) in self.list.iter_mut() {
            if !*live {
                *lost += 1;
                continue;
            }
            if let Err(e) = sink.write(item) {
                *live = recover(sink.as_mut(), e, |k| k.write(item));
                *lost += u64::from(!*live);
            }
        }
    }

    /// The live sinks' degradations.
    pub fn degraded(&self) -> impl Iterator<Item = (&'static str, String)> + '_ {
        self.list
            .iter()
            .filter(|(_, l, _)| *l)
            .filter_map(|(s, _, _)| s.degraded())
    }

    pub fn finish(&mut self, end: &mut E) {
        for (sink, live, lost) in self.list.iter_mut() {
            if !*live {
                sink.stopped(end, *lost);
                continue;
            }
            if let Err(e) = sink.finish(end) {
                *live = recover(sink.as_mut(), e, |k| k.finish(end));
            }
        }
    }
}

/// Says what failed and where the sink goes on; whether it still lives.
fn recover<T: ?Sized, E: ?Sized>(
    sink: &mut dyn Sink<T, E>,
    e: anyhow::Error,
    mut again: impl FnMut(&mut dyn Sink<T, E>) -> anyhow::Result<()>,
) -> bool {
    const STOPS: &str = "the command goes on; this output stops";
    let Some(path) = sink.fall_back() else {
        say(format_args!("{e:#} ({STOPS})"));
        return false;
    };
    match again(sink) {
        Ok(()) => {
            say(format_args!("{e:#}; continued in {}", path.display()));
            true
        }
        Err(e2) => {
            say(format_args!(
                "{e:#}; and in {}: {e2:#} ({STOPS})",
                path.display()
            ));
            false
        }
    }
}

/// A new file `name` in a private directory under the temp dir, for what could
/// not be written where the user asked; under sudo the invoking user's.
pub fn fallback_file(name: &str, owner: Option<&Owner>) -> std::io::Result<(File, PathBuf)> {
    // A TMPDIR that is missing, read-only or a file: /tmp next.
    let made = fsafe::private_dir(&fsafe::temp_dir(), "resource-tracker-kept-").or_else(|e| {
        let tmp = Path::new("/tmp");
        if fsafe::temp_dir() == tmp {
            return Err(e);
        }
        fsafe::private_dir(tmp, "resource-tracker-kept-")
    });
    let (dir, fd) = made?;
    let f = fsafe::create_in(&fd, name, false)?;
    if let Some(o) = owner {
        std::os::unix::fs::fchown(fd.as_fd(), Some(o.uid), Some(o.gid))?;
        std::os::unix::fs::fchown(f.as_fd(), Some(o.uid), Some(o.gid))?;
    }
    Ok((f, dir.join(name)))
}

/// After a failed write to `f`, which had `whole` bytes of whole lines: cuts
/// off what the failed write left of a line (a full disk takes part of one), so
/// that every line is whole in one file, never split between this one and the
/// file kept instead. Where it cannot be cut, the partial line stays: said once.
pub fn whole_lines_only(f: &File, whole: u64) {
    let len = f.metadata().map(|m| m.len()).unwrap_or(whole);
    if len > whole {
        if let Err(e) = f.set_len(whole) {
            crate::warn::warn_once(
                "partial-line",
                format_args!("a partial line stays at the end of a file that filled up ({e})"),
            );
        }
    }
}

/// Encoding of the sample lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv,
}

/// Creates (truncates) a file the user asked for, as `create` does; but when
/// what stands at the path is someone else's (a FIFO planted in /tmp, another
/// user's file where root writes), the output goes to a private file of its own
/// instead, said in one line, and the command still runs: another user cannot
/// keep it from running by planting a name. Also returns where it went instead.
pub fn create_or_keep(
    path: &Path,
    what: &str,
    kept_name: &str,
    owner: Option<&Owner>,
) -> anyhow::Result<(File, Option<PathBuf>)> {
    match fsafe::create_output(path, owner) {
        Ok(f) => Ok((f, None)),
        Err(e) if fsafe::someone_elses(path, owner) => {
            let (f, kept) = match fallback_file(kept_name, owner) {
                Ok(k) => k,
                Err(e2) => {
                    // Kept nowhere: the output is lost, said, and the command
                    // still runs (someone else's name cannot stop it).
                    let null = File::options()
                        .write(true)
                        .open("/dev/null")
                        .with_context(|| {
                            format!(
                                "cannot write {what} file {}: {e}; nor a private file instead ({e2})",
                                path.display()
                            )
                        })?;
                    say(format_args!(
                        "cannot write {what} file {}: {e}; nor a private file instead ({e2}): this output is lost, and the command runs",
                        path.display()
                    ));
                    return Ok((null, None));
                }
            };
            say(format_args!(
                "cannot write {what} file {}: {e}; it goes to {} instead, and the command runs",
                path.display(),
                kept.display()
            ));
            Ok((f, Some(kept)))
        }
        Err(e) => Err(e).with_context(|| format!("cannot write {what} file {}", path.display())),
    }
}

/// Creates (truncates) a file the user asked for, naming it in the error; under
/// sudo as `owner`, whose file it becomes.
pub fn create(path: &Path, what: &str, owner: Option<&Owner>) -> anyhow::Result<File> {
    fsafe::create_output(path, owner)
        .with_context(|| format!("cannot write {what} file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that takes `ok` items, then fails with nowhere to fall back to.
    struct Failing {
        ok: usize,
        got: usize,
    }

    impl Sink<u32, u64> for Failing {
        fn write(&mut self, _: &u32) -> anyhow::Result<()> {
            if self.got == self.ok {
                anyhow::bail!("full");
            }
            self.got += 1;
            Ok(())
        }
        fn finish(&mut self, _: &mut u64) -> anyhow::Result<()> {
            Ok(())
        }
        fn stopped(&mut self, end: &mut u64, lost: u64) {
            *end = lost;
        }
    }

    /// A sink that stops is told at the end how many items it never got, the
    /// one that failed included: every item is either written or counted.
    #[test]
    fn a_stopped_sink_is_told_what_it_lost() {
        let mut sinks: Sinks<u32, u64> = Sinks::new(vec![Box::new(Failing { ok: 3, got: 0 })]);
        for i in 0..10 {
            sinks.write(&i);
        }
        let mut lost = 0;
        sinks.finish(&mut lost);
        assert_eq!(lost, 7);
    }
}
