//! Helpers shared by the executor's integration tests: the kit's process
//! scan under the name these tests use.

pub use testkit::procs::with_cmdline as procs_with;
