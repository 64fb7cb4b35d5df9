//! Daemon plumbing shared by `ongrid-skilld` and `ongrid-executor`: the
//! pieces both daemons need around their own work, written once.
//!
//! # Layout
//!
//! - [`errors`]: an error and its sources as one `a: b: c` line.
//! - [`peer`]: [`peer::hung_up`], whether the other end of a connection left.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod errors;
pub mod peer;
