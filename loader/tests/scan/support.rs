//! Temp trees of real files and a runner for the real `ongrid-skill` binary.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ongrid-skill");
pub const ENV_VAR: &str = "ONGRID_SKILLS_EXTERNAL_DIRS";

/// `path` and its missing parents, mode 0755 whatever the umask (under
/// umask 002 they would be group writable, which `validate` notes).
fn make_dirs(path: &Path) {
    fs::DirBuilder::new().recursive(true).mode(0o755).create(path).unwrap();
}

/// A temp dir with a canonical base path, traversable by every user (so
/// the unprivileged runs can reach it).
pub struct Tree {
    _tmp: tempfile::TempDir,
    pub base: PathBuf,
}

impl Tree {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        Tree { _tmp: tmp, base }
    }

    /// `base/rel`, with its parent directories created.
    pub fn path(&self, rel: &str) -> PathBuf {
        let p = self.base.join(rel);
        if let Some(parent) = p.parent() {
            make_dirs(parent);
        }
        p
    }

    pub fn dir(&self, rel: &str) -> PathBuf {
        let p = self.base.join(rel);
        make_dirs(&p);
        p
    }

    pub fn write(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.path(rel);
        fs::write(&p, content).unwrap();
        p
    }

    /// An executable shell script at `rel`.
    pub fn exe(&self, rel: &str) -> PathBuf {
        let p = self.write(rel, "#!/bin/sh\necho '{}'\n");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    pub fn symlink(&self, target: impl AsRef<Path>, rel: &str) -> PathBuf {
        let p = self.path(rel);
        symlink(target, &p).unwrap();
        p
    }

    /// A pack: `dir/skill.json` naming `name` with entry `run`, and an
    /// executable `dir/run`. Returns the manifest path.
    pub fn pack(&self, dir: &str, name: &str) -> PathBuf {
        self.exe(&format!("{dir}/run"));
        self.manifest(
            dir,
            &format!(r#"{{"name":"{name}","description":"{name} skill","entry":"run"}}"#),
        )
    }

    /// `dir/skill.json` with the given content.
    pub fn manifest(&self, dir: &str, json: &str) -> PathBuf {
        self.write(&format!("{dir}/skill.json"), json)
    }
}

/// What a run of the binary produced.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().collect()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }

    /// Names of the skills in `scan --json` output, in order.
    pub fn names(&self) -> Vec<String> {
        self.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// A command line for the binary.
pub struct Cli {
    cmd: Command,
}

impl Cli {
    pub fn new(args: &[&str]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env_remove(ENV_VAR);
        Cli { cmd }
    }

    /// `scan --json DIR...`
    pub fn scan_json(dirs: &[&Path]) -> Self {
        let mut cli = Cli::new(&["scan", "--json"]);
        cli.cmd.args(dirs);
        cli
    }

    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Self {
        self.cmd.arg(arg);
        self
    }

    pub fn env(mut self, value: &str) -> Self {
        self.cmd.env(ENV_VAR, value);
        self
    }

    pub fn cwd(mut self, dir: &Path) -> Self {
        self.cmd.current_dir(dir);
        self
    }

    /// Runs as `nobody` through `setpriv`, or returns `None` (and says
    /// SKIP) when not root.
    pub fn unprivileged(self) -> Option<Self> {
        if !is_root() {
            eprintln!("SKIP: not root, cannot run the scan as an unprivileged user");
            return None;
        }
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        cmd.arg(self.cmd.get_program()).args(self.cmd.get_args());
        for (k, v) in self.cmd.get_envs() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        Some(Cli { cmd })
    }

    /// Runs to completion, failing the test if it takes over 20 s (a scan
    /// that blocks on a FIFO must fail, not hang).
    pub fn run(mut self) -> Run {
        let mut child = self
            .cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout_pipe = child.stdout.take().unwrap();
        let mut stderr_pipe = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            stdout_pipe.read_to_string(&mut s).unwrap();
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            stderr_pipe.read_to_string(&mut s).unwrap();
            s
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("ongrid-skill did not finish within 20 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Run {
            code: status.code().unwrap_or(-1),
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    }
}

pub fn is_root() -> bool {
    // /proc/self is owned by the effective uid of the process reading it.
    fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// The exact registration line.
pub fn registered(name: &str, manifest: &Path) -> String {
    format!("skill loader: registered subprocess skill \"{name}\" from {}", manifest.display())
}

/// The exact summary line.
pub fn summary(n: usize) -> String {
    format!("skill loader: {n} skill{} registered", if n == 1 { "" } else { "s" })
}
