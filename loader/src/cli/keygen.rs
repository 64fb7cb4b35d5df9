//! `ongrid-skill keygen [--out FILE] [--name NAME] [--force]`: make an
//! approver key (Ed25519).
//!
//! The private key (the base64 of a 32-byte seed from `/dev/urandom`, one
//! line) goes to `--out`, created with mode 0600 (an existing file is kept
//! unless `--force`). stdout gets the `[[approvers]]` block to paste into
//! `skilld.toml`, with the key id as a comment. Without `--out` the private
//! key is printed on stdout and the block on stderr.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use policy::approval::SecretKey;

use super::remote::exit;

/// Arguments of `keygen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the private key (mode 0600). Without it the key is
    /// printed on stdout and the [[approvers]] block on stderr.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The approver's name in the printed block [default: the file's stem].
    #[arg(long)]
    pub name: Option<String>,
    /// Overwrite an existing --out file.
    #[arg(long)]
    pub force: bool,
}

/// Makes a key.
///
/// # Errors
///
/// I/O errors writing the output.
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> io::Result<ExitCode> {
    let mut seed = [0u8; 32];
    if let Err(e) = fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut seed)) {
        writeln!(err, "ongrid-skill keygen: cannot read /dev/urandom: {e}")?;
        return Ok(ExitCode::from(exit::FAILED));
    }
    let key = SecretKey::from_seed(seed);
    seed.fill(0);
    let name = args
        .name
        .clone()
        .or_else(|| {
            args.out.as_ref().and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "approver".to_owned());
    let block = format!(
        "[[approvers]]\nname = {}\npublic_key = \"{}\"\n# key_id = {}\n",
        toml_string(&name),
        key.public_key(),
        key.key_id()
    );
    let Some(path) = &args.out else {
        writeln!(out, "{}", key.to_base64())?;
        write!(err, "{block}")?;
        return Ok(ExitCode::SUCCESS);
    };
    if args.force {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                writeln!(err, "ongrid-skill keygen: {}: {e}", path.display())?;
                return Ok(ExitCode::from(exit::FAILED));
            }
        }
    }
    let written =
        fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).and_then(
            |mut f| {
                f.write_all(format!("{}\n", key.to_base64()).as_bytes())?;
                f.sync_all()
            },
        );
    if let Err(e) = written {
        let hint =
            if e.kind() == io::ErrorKind::AlreadyExists { " (--force overwrites)" } else { "" };
        writeln!(err, "ongrid-skill keygen: {}: {e}{hint}", path.display())?;
        return Ok(ExitCode::from(exit::FAILED));
    }
    write!(out, "{block}")?;
    writeln!(
        err,
        "ongrid-skill keygen: private key in {} (mode 0600): keep it secret",
        path.display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    // JSON string escaping is valid TOML basic-string escaping.
    serde_json::Value::String(s.to_owned()).to_string()
}
