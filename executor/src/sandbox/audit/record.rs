//! The audit records a run's refusals come as, parsed from their text
//! (`audit(1796541393.127:40): domain=1584271f8 blockers=fs.read_file
//! path="/etc/shadow" dev="vda" ino=1254`). Records of one event share
//! the serial after the colon: a Landlock refusal is an
//! `AUDIT_LANDLOCK_ACCESS` record (the domain, what was refused, the
//! object), the first one of a domain followed by an
//! `AUDIT_LANDLOCK_DOMAIN` record naming the pid that made the domain,
//! then the `AUDIT_SYSCALL` record of the call (with its pid); a seccomp
//! refusal is one `AUDIT_SECCOMP` record with the pid and the call.

/// `AUDIT_SYSCALL`.
pub const SYSCALL: u16 = 1300;
/// `AUDIT_SECCOMP`.
pub const SECCOMP: u16 = 1326;
/// `AUDIT_LANDLOCK_ACCESS`.
pub const LANDLOCK_ACCESS: u16 = 1423;
/// `AUDIT_LANDLOCK_DOMAIN`.
pub const LANDLOCK_DOMAIN: u16 = 1424;

/// `SECCOMP_RET_ACTION_FULL`: the action bits of a seccomp `code`.
const SECCOMP_ACTION: u32 = 0xffff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_KILL_THREAD: u32 = 0;
const SECCOMP_RET_TRAP: u32 = 0x0003_0000;

/// One record of interest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Landlock refused something to a task of `domain`.
    Access {
        /// The domain's id.
        domain: u64,
        /// What was refused: `fs.read_file`, `fs.write_file,fs.truncate`,
        /// `net.connect_tcp`, `scope.signal`...
        blockers: String,
        /// The file, when the object is one.
        path: Option<String>,
        /// `addr:port` for a network refusal.
        destination: Option<String>,
    },
    /// Landlock names a domain's maker (first refusal of the domain).
    Domain {
        /// The domain's id.
        domain: u64,
        /// The task that made it.
        pid: i32,
    },
    /// The seccomp filter refused (or killed on) a call.
    Seccomp {
        /// The calling task.
        pid: i32,
        /// The call's number.
        syscall: i64,
        /// The call was of the native architecture.
        native: bool,
        /// `errno`, `kill` or `trap`.
        action: &'static str,
    },
    /// The call an event happened in.
    Syscall {
        /// The calling task.
        pid: i32,
    },
}

/// A parsed record with its event's serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The serial its event's records share.
    pub serial: u64,
    /// What it says.
    pub record: Record,
}

/// The value of `key=` in `fields`: quoted (`"..."`), or a bare word
/// (audit writes a string with spaces, quotes or control characters as
/// hexadecimal, unquoted).
fn value<'a>(fields: &'a str, key: &str) -> Option<std::borrow::Cow<'a, str>> {
    let mut rest = fields;
    loop {
        let at = rest.find(key)?;
        let before_ok = at == 0 || rest.as_bytes().get(at - 1) == Some(&b' ');
        let after = &rest[at + key.len()..];
        if before_ok && after.starts_with('=') {
            let v = &after[1..];
            if let Some(q) = v.strip_prefix('"') {
                return q.find('"').map(|end| std::borrow::Cow::Borrowed(&q[..end]));
            }
            let word = v.split(' ').next().unwrap_or_default();
            return Some(std::borrow::Cow::Borrowed(word));
        }
        rest = after;
    }
}

/// A bare string value written as hexadecimal, decoded.
fn unhex(word: &str) -> Option<String> {
    if !word.len().is_multiple_of(2) || !word.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..word.len())
        .step_by(2)
        .map(|i| word.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    Some(String::from_utf8_lossy(&bytes?).into_owned())
}

/// A string field: quoted as is, bare decoded from hexadecimal.
fn string(fields: &str, key: &str) -> Option<String> {
    let at = fields.find(&format!(" {key}="))?;
    let quoted = fields.get(at + key.len() + 2..)?.starts_with('"');
    let v = value(fields, key)?;
    if quoted {
        Some(v.into_owned())
    } else {
        Some(unhex(&v).unwrap_or_else(|| v.into_owned()))
    }
}

fn number<T: std::str::FromStr>(fields: &str, key: &str) -> Option<T> {
    value(fields, key)?.parse().ok()
}

fn hex(fields: &str, key: &str) -> Option<u64> {
    let v = value(fields, key)?;
    u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()
}

fn seccomp_action(code: u32) -> &'static str {
    match code & SECCOMP_ACTION {
        SECCOMP_RET_ERRNO => "errno",
        SECCOMP_RET_KILL_PROCESS | SECCOMP_RET_KILL_THREAD => "kill",
        SECCOMP_RET_TRAP => "trap",
        _ => "log",
    }
}

/// The serial of `audit(SECONDS.MILLIS:SERIAL): ...` and the fields after.
fn header(text: &str) -> Option<(u64, &str)> {
    let rest = text.strip_prefix("audit(")?;
    let close = rest.find("):")?;
    let serial = rest.get(..close)?.rsplit(':').next()?.parse().ok()?;
    // A leading space kept so that every field is found as " key=".
    Some((serial, rest.get(close + 2..)?))
}

/// The record of type `kind` whose text is `text`; `None` for another
/// type or a record that does not parse.
#[must_use]
pub fn parse(kind: u16, text: &str) -> Option<Parsed> {
    let (serial, fields) = header(text.trim_end_matches(['\0', '\n']))?;
    let record = match kind {
        LANDLOCK_ACCESS => {
            let blockers = value(fields, "blockers")?.into_owned();
            let destination = match (value(fields, "daddr"), value(fields, "dest")) {
                (Some(a), Some(p)) if a.contains(':') => Some(format!("[{a}]:{p}")),
                (Some(a), Some(p)) => Some(format!("{a}:{p}")),
                (None, Some(p)) => Some(format!("*:{p}")),
                _ => None,
            };
            Record::Access {
                domain: hex(fields, "domain")?,
                blockers,
                path: string(fields, "path"),
                destination,
            }
        }
        LANDLOCK_DOMAIN => {
            if value(fields, "status")? != "allocated" {
                return None;
            }
            Record::Domain { domain: hex(fields, "domain")?, pid: number(fields, "pid")? }
        }
        SECCOMP => {
            let arch = hex(fields, "arch")?;
            Record::Seccomp {
                pid: number(fields, "pid")?,
                syscall: number(fields, "syscall")?,
                native: arch == u64::from(crate::sandbox::seccomp::AUDIT_ARCH),
                action: seccomp_action(u32::try_from(hex(fields, "code")?).ok()?),
            }
        }
        SYSCALL => Record::Syscall { pid: number(fields, "pid")? },
        _ => return None,
    };
    Some(Parsed { serial, record })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn landlock_records_parse() {
        let a = parse(
            LANDLOCK_ACCESS,
            "audit(1796541393.127:40): domain=1584271f8 blockers=fs.read_file \
             path=\"/etc/shadow\" dev=\"vda\" ino=1254",
        )
        .unwrap();
        assert_eq!(a.serial, 40);
        assert_eq!(
            a.record,
            Record::Access {
                domain: 0x1_5842_71f8,
                blockers: "fs.read_file".into(),
                path: Some("/etc/shadow".into()),
                destination: None,
            }
        );
        let d = parse(
            LANDLOCK_DOMAIN,
            "audit(1.2:37): domain=1584271f8 status=allocated mode=enforcing pid=18607 uid=0 \
             exe=\"/tmp/dx/t\" comm=\"t\"",
        )
        .unwrap();
        assert_eq!(d.record, Record::Domain { domain: 0x1_5842_71f8, pid: 18607 });
        assert!(parse(LANDLOCK_DOMAIN, "audit(1.2:45): domain=1 status=deallocated denials=7")
            .is_none());
        // A name with a space is written in hexadecimal, unquoted.
        let h = parse(LANDLOCK_ACCESS, "audit(1.2:3): domain=a blockers=fs.make_reg path=2F612062")
            .unwrap();
        assert!(matches!(h.record, Record::Access { path: Some(p), .. } if p == "/a b"));
        let n = parse(
            LANDLOCK_ACCESS,
            "audit(1.2:3): domain=a blockers=net.connect_tcp daddr=127.0.0.1 dest=80",
        )
        .unwrap();
        assert!(
            matches!(n.record, Record::Access { destination: Some(d), .. } if d == "127.0.0.1:80")
        );
    }

    #[test]
    fn seccomp_and_syscall_records_parse() {
        let s = parse(
            SECCOMP,
            "audit(1796541393.131:43): auid=4294967295 uid=0 gid=0 ses=4294967295 pid=18609 \
             comm=\"unshare\" exe=\"/usr/bin/unshare\" sig=0 arch=c000003e syscall=272 \
             compat=0 ip=0x7fa9b7be50f7 code=0x50000",
        )
        .unwrap();
        let native = cfg!(target_arch = "x86_64");
        assert_eq!(s.record, Record::Seccomp { pid: 18609, syscall: 272, native, action: "errno" });
        let c = parse(
            SYSCALL,
            "audit(1.2:38): arch=c000003e syscall=257 success=no ppid=1 pid=5 auid=1",
        )
        .unwrap();
        assert_eq!(c.record, Record::Syscall { pid: 5 });
        for bad in ["", "audit(", "audit(1.2:x): pid=1", "audit(1.2:3): pid="] {
            assert!(parse(SYSCALL, bad).is_none(), "{bad}");
        }
        assert!(parse(1320, "audit(1.2:3): ").is_none());
    }
}
