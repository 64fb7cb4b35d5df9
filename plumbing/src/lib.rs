//! Daemon plumbing shared by `ongrid-skilld` and `ongrid-executor`: the
//! pieces both daemons need around their own work, written once.
//!
//! # Layout
//!
//! - [`journald`]: log lines with journald's `<N>` priorities and no
//!   timestamp when stderr is the journal's stream; [`journald::try_init`]
//!   installs the subscriber, [`journald::eprint`] writes a record outside it.
//! - [`log_line`]: the daemons' `tracing` subscriber, each record one line
//!   (the control characters in its fields escaped).
//! - [`notify`]: sd-notify (`READY=1`, `RELOADING=1`, `STOPPING=1`,
//!   `STATUS=`) and the listening socket of socket activation.
//! - [`process_metrics`]: [`process_metrics::ProcessMetrics`], the
//!   process's own `process_*` metrics with the CPU time exact.
//! - [`socket`]: the socket node: bound with its mode and owner, a stale
//!   node replaced, a live one kept, removed at exit while still its own.
//! - [`accept`]: the accept loop: a permit per connection, a doubling
//!   pause after a failed `accept`, cancellable at every wait.
//! - [`errors`]: an error and its sources as one `a: b: c` line.
//! - [`peer`]: [`peer::hung_up`], whether the other end of a connection left.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod accept;
pub mod errors;
pub mod journald;
pub mod log_line;
pub mod notify;
pub mod peer;
pub mod process_metrics;
pub mod socket;
