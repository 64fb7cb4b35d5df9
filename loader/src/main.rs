//! `ongrid-skill`: see [`loader::cli`].

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use loader::cli::Cli;

fn main() -> ExitCode {
    // Before any thread: no signal blocked, whatever the parent left
    // blocked (`up` stops on SIGTERM and SIGINT, and its skilld reloads on
    // SIGHUP; the executor it starts sets its own mask).
    let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
    let cli = Cli::parse();
    // Not locked: `up` logs from other threads while the command runs.
    let mut out = io::stdout();
    let mut err = io::stderr();
    let result = loader::cli::run(cli, &mut out, &mut err).and_then(|code| match out.flush() {
        // What stayed buffered for a reader gone: the command's own code
        // stands (`up` whose ready lines no one read failed).
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(code),
        flushed => flushed.map(|()| code),
    });
    match result.context("writing output") {
        Ok(code) => code,
        // A closed pipe (`ongrid-skill scan | head`) is not an error.
        Err(e)
            if e.downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(err, "ongrid-skill: {e:#}");
            ExitCode::FAILURE
        }
    }
}
