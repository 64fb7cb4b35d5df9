//! A process outside the sandbox, owned by the run-as user, that sandboxed
//! skills try to signal, trace or read. Only the sandbox stands between
//! them: same uid, so plain Unix permissions would allow all of it.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A sleeping `attack victim` process; killed on drop.
#[derive(Debug)]
pub struct Victim {
    child: Child,
    /// Its pid.
    pub pid: i32,
    /// Address of a secret in its memory (for `process_vm_readv`).
    pub addr: u64,
}

impl Victim {
    /// Starts `attack_bin victim` as `uid:gid`.
    ///
    /// # Panics
    ///
    /// When it cannot be started or does not announce itself.
    pub fn spawn(attack_bin: &Path, uid: u32, gid: u32) -> Self {
        let mut child = Command::new(attack_bin)
            .arg("victim")
            .uid(uid)
            .gid(gid)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn victim");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("victim announces itself");
        let v: serde_json::Value = serde_json::from_str(&line).expect("victim line is JSON");
        let pid = i32::try_from(child.id()).expect("pid fits i32");
        Self { child, pid, addr: v["addr"].as_u64().expect("addr") }
    }

    /// Returns true if and only if the victim is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
