//! Test support for the cross-process suites (filled in by the sandbox suite).
