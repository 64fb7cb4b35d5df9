//! Integration tests of the loader scan and the `ongrid-skill scan` and
//! `validate` commands: real trees in temp dirs (symlinks, modes, FIFOs,
//! unreadable paths), the real binary, log lines compared byte for byte.

mod support;

mod duplicates;
mod entries;
mod manifests;
mod output;
mod roots;
mod skillmd;
mod usage;
mod validate;
mod walk;
