//! The module graph of each library crate has no cycle.
//!
//! A cycle here is a set of file-level modules that refer to items of each
//! other (through `use` or a path in code), directly or through a chain.
//! A module's `mod` declarations and its `pub use` of its own descendants
//! are not references: a path through a re-export is followed to the module
//! that defines the item. Paths are read with `syn`, not with a compiler, so
//! macros' bodies and glob imports of another module's items are not
//! followed; what it reports is still a real reference.

mod graph;

use std::path::Path;

use graph::{cycles_with_members, CrateGraph};

fn check(krate: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src");
    if !src.join("lib.rs").exists() {
        println!("SKIP: {krate} has no src/lib.rs");
        return;
    }
    let graph = CrateGraph::read(&src).unwrap_or_else(|e| panic!("reading {krate}: {e}"));
    let found = cycles_with_members(&graph);
    let lines: Vec<String> = found
        .iter()
        .map(|(walk, members)| {
            format!("  {}   (all of: {})", walk.join(" -> "), members.join(", "))
        })
        .collect();
    assert!(found.is_empty(), "module cycles in {krate}:\n{}", lines.join("\n"));
}

#[test]
fn executor_has_no_module_cycle() {
    check("executor");
}

#[test]
fn loader_has_no_module_cycle() {
    check("loader");
}

#[test]
fn policy_has_no_module_cycle() {
    check("policy");
}

#[test]
fn plumbing_has_no_module_cycle() {
    check("plumbing");
}
