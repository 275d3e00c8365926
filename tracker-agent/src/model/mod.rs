//! Every type the tracker serialises, and the arithmetic that turns the sources'
//! cumulative readings into per-interval samples and the run summary. Nothing here
//! reads the system or writes anywhere.

pub mod csv;
pub mod degraded;
pub mod event;
pub mod fields;
pub mod host;
pub mod meta;
pub mod node;
pub mod otlp;
pub mod reading;
pub mod recorded;
pub mod report;
pub mod sample;
pub mod sampler;
pub mod stats;
pub mod summary;

pub use event::ProcEvent;
pub use host::{CloudInfo, Discovered, Identity};
pub use meta::JobMeta;
pub use reading::{HostReading, OwnCost, ProcessGpu, Reading, Stamp};
pub use sample::{HostInfo, Sample};
pub use sampler::Sampler;
pub use summary::{BpfProgram, OtlpReport, RunStats, StreamReport, Summary, TopCommand};
