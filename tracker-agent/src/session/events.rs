//! The tree's process events on their way out: stamped with the wall clock, given
//! to their sinks (the `--events` file, the report's timeline) and counted for the
//! summary's top commands.

use crate::{
    model::{event::TopCommands, ProcEvent, TopCommand},
    sink::Sinks,
};

pub struct EventLog {
    sinks: Sinks<ProcEvent, ()>,
    tops: TopCommands,
    /// Unix time − CLOCK_MONOTONIC, read once: events carry both.
    offset: f64,
}

/// Unix seconds minus monotonic seconds, now.
fn clock_offset() -> f64 {
    crate::model::reading::unix_now() - crate::sys::monotonic_ns() as f64 / 1e9
}

impl EventLog {
    pub fn new(sinks: Sinks<ProcEvent, ()>) -> EventLog {
        EventLog {
            sinks,
            tops: TopCommands::default(),
            offset: clock_offset(),
        }
    }

    pub fn show(&mut self, mut ev: ProcEvent) {
        ev.timestamp_secs = ((ev.monotonic_secs + self.offset) * 1e6).round() / 1e6;
        self.sinks.write(&ev);
        self.tops.add(&ev);
    }

    /// Ends the sinks; the commands with the most CPU, most first.
    pub fn finish(mut self) -> Vec<TopCommand> {
        self.sinks.finish(&mut ());
        self.tops.top()
    }
}
