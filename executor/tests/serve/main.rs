//! `ongrid-executor serve` end to end: `server::run` in-process on a socket
//! in a temporary directory (and once the real binary), driven by plain
//! blocking clients. Every server runs on its own multi-thread runtime whose
//! blocking-pool threads exit after 100 ms idle, so a run spawned from such
//! a thread would be killed by its parent-death signal and fail the tests.
//!
//! Root only (the sandbox needs it); as another user each test prints SKIP.

#[path = "../common/mod.rs"]
mod common;
mod support;

mod admission;
mod lifecycle;
mod mcp;
mod sandbox;
mod socket;
mod warm;
mod wire;
