//! `ongrid-gen-docs OUT_DIR`: writes the man pages (`OUT_DIR/man/*.1` for
//! the `ongrid-skill` command, `OUT_DIR/man/*.8` for the two daemons, the
//! section of system administration commands) and
//! the bash, zsh and fish completions (`OUT_DIR/completions/{bash,zsh,fish}/`)
//! of `ongrid-executor`, `ongrid-skilld` and `ongrid-skill` from their clap
//! definitions (`executor::cli`, `loader::daemon::cli`, `loader::cli`), so
//! the packaged documentation always matches the binaries. Run by
//! `packaging/build.sh`; not shipped.
//!
//! Exit codes: 0 written, 1 an I/O error, 2 usage.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

/// Where each shell's completion for `name` goes, as the distributions'
/// completion loaders look it up.
fn completion_file(shell: Shell, name: &str) -> String {
    match shell {
        Shell::Zsh => format!("_{name}"),
        Shell::Fish => format!("{name}.fish"),
        _ => name.to_owned(),
    }
}

/// `text` as literal roff lines: no filling (tables of exit codes keep
/// their columns), backslashes, leading dots/quotes and minus signs escaped.
fn literal(text: &str) -> String {
    let mut out = String::from(".nf\n");
    for line in text.lines() {
        let line = line.replace('\\', "\\e").replace('-', "\\-");
        if line.starts_with('.') || line.starts_with('\'') {
            out.push_str("\\&");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(".fi\n");
    out
}

/// One man page: clap_mangen's sections, with the `--help` epilogue
/// (`after_help`: exit codes, systemd behaviour) as a literal NOTES
/// section instead of clap_mangen's filled EXTRA paragraph.
fn page(cmd: &clap::Command, section: &str) -> io::Result<Vec<u8>> {
    let version = cmd.get_version().unwrap_or_default().to_owned();
    let man = clap_mangen::Man::new(cmd.clone())
        .section(section)
        .source(format!("ongrid-skills {version}"));
    let mut w = Vec::new();
    man.render_title(&mut w)?;
    man.render_name_section(&mut w)?;
    man.render_synopsis_section(&mut w)?;
    man.render_description_section(&mut w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut w)?;
    }
    if cmd.get_subcommands().any(|c| !c.is_hide_set()) {
        man.render_subcommands_section(&mut w)?;
    }
    if let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
        w.extend_from_slice(b".SH NOTES\n");
        w.extend_from_slice(literal(&after.to_string()).as_bytes());
    }
    if !version.is_empty() {
        man.render_version_section(&mut w)?;
    }
    Ok(w)
}

/// Writes the page of `cmd` in `section` and, as clap_mangen names them
/// (`ongrid-skill-run.1`), of each visible subcommand, recursively.
fn pages(man: &Path, cmd: &clap::Command, section: &str) -> io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(man, sub, section)?;
    }
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
    fs::write(man.join(format!("{name}.{section}")), page(cmd, section)?)
}

fn write_one(out: &Path, cmd: clap::Command, section: &str, description: &str) -> io::Result<()> {
    let name = cmd.get_name().to_owned();
    // NAME line of the page (`ongrid-skill - ...`); the original text stays
    // as the DESCRIPTION.
    let long = cmd.get_long_about().or_else(|| cmd.get_about()).cloned().unwrap_or_default();
    let mut cmd = cmd.about(description.to_owned()).long_about(long).disable_help_subcommand(true);
    cmd.build();
    let man = out.join("man");
    fs::create_dir_all(&man)?;
    pages(&man, &cmd, section)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let dir = out.join("completions").join(shell.to_string());
        fs::create_dir_all(&dir)?;
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cmd, name.clone(), &mut text);
        fs::write(dir.join(completion_file(shell, &name)), text)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [out] = args.as_slice() else {
        eprintln!("usage: ongrid-gen-docs OUT_DIR");
        return ExitCode::from(2);
    };
    // Section 8 for the daemons (run by root or systemd), 1 for the command.
    let pages = [
        (
            executor::cli::Cli::command(),
            "8",
            "sandboxing executor of ongrid-skills (root daemon and one-shot runs)",
        ),
        (
            loader::daemon::cli::Args::command(),
            "8",
            "registry daemon of ongrid-skills (client API and metrics)",
        ),
        (loader::cli::Cli::command(), "1", "command-line client and pack linter of ongrid-skills"),
    ];
    for (cmd, section, description) in pages {
        if let Err(e) = write_one(out, cmd, section, description) {
            eprintln!("ongrid-gen-docs: {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
