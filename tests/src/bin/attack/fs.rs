//! Filesystem escapes: reads, writes, links, symlinks, truncation, special
//! files, setuid executables.

use std::ffi::CString;
use std::io::{Read, Write};

use serde_json::{json, Value};

use crate::{errno, io_errno, num, outcome, param};

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

fn write_file(path: &str) -> Result<Value, i32> {
    write_data(path, b"ongrid-pwned")
}

fn write_data(path: &str, data: &[u8]) -> Result<Value, i32> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_errno(&e))?;
    f.write_all(data).map_err(|e| io_errno(&e))?;
    Ok(json!({}))
}

fn exec_setuid(path: &str) -> Result<Value, i32> {
    let out = std::process::Command::new(path)
        .arg("euid")
        .env_clear()
        .output()
        .map_err(|e| io_errno(&e))?;
    let child: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = u64::from(unsafe { libc::geteuid() });
    // Errno 0: the exec worked but gained nothing.
    match child["euid"].as_u64() {
        Some(euid) if euid != me => Ok(json!({"child": child})),
        _ => Err(0),
    }
}

/// Leaves a run dir that is hard to clean: a deep chain of dirs, a FIFO,
/// symlinks to `/` and to `target`, and a mode-000 subtree.
fn messy_run_dir(args: &Value) -> Result<Value, i32> {
    let cwd = std::env::current_dir().map_err(|e| io_errno(&e))?;
    let _ = std::os::unix::fs::symlink("/", "root-link");
    let _ = std::os::unix::fs::symlink(param(args, "target"), "target-link");
    let fifo = cstr("fifo");
    // SAFETY: `fifo` is a valid NUL-terminated string for the duration of the call.
    unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
    std::fs::create_dir("locked").map_err(|e| io_errno(&e))?;
    std::fs::write("locked/file", b"x").map_err(|e| io_errno(&e))?;
    let depth = crate::num(args, "depth", 2000);
    for _ in 0..depth {
        std::fs::create_dir("d").map_err(|e| io_errno(&e))?;
        std::env::set_current_dir("d").map_err(|e| io_errno(&e))?;
    }
    std::env::set_current_dir(&cwd).map_err(|e| io_errno(&e))?;
    std::fs::set_permissions("locked", std::os::unix::fs::PermissionsExt::from_mode(0o000))
        .map_err(|e| io_errno(&e))?;
    Ok(json!({"cwd": cwd.to_string_lossy(), "depth": depth}))
}

/// Runs one filesystem case.
pub(crate) fn attempt(case: &str, args: &Value) -> Value {
    // `{ppid}` stands for the parent's pid (the executor side of the run).
    // SAFETY: getppid cannot fail and touches no memory.
    let ppid = unsafe { libc::getppid() };
    let path = &param(args, "path").replace("{ppid}", &ppid.to_string());
    let r = match case {
        "read" => std::fs::File::open(path).map_err(|e| io_errno(&e)).and_then(|mut f| {
            let mut buf = [0u8; 64];
            let n = f.read(&mut buf).map_err(|e| io_errno(&e))?;
            Ok(json!({"bytes": n}))
        }),
        "write" => match args["data"].as_str() {
            Some(d) => write_data(path, d.as_bytes()),
            None => write_file(path),
        },
        "list" => std::fs::read_dir(path)
            .map_err(|e| io_errno(&e))
            .map(|d| json!({"entries": d.flatten().count()})),
        "mkdir" => std::fs::create_dir(path).map(|()| json!({})).map_err(|e| io_errno(&e)),
        "symlink_write" => {
            let link = "escape-link";
            match std::os::unix::fs::symlink(param(args, "target"), link) {
                Err(e) => Err(io_errno(&e)),
                Ok(()) => write_file(link),
            }
        }
        "link" => std::fs::hard_link(param(args, "src"), param(args, "dst"))
            .map(|()| json!({}))
            .map_err(|e| io_errno(&e)),
        "rename" => std::fs::rename(param(args, "src"), param(args, "dst"))
            .map(|()| json!({}))
            .map_err(|e| io_errno(&e)),
        "truncate" => {
            let p = cstr(path);
            // SAFETY: `p` is a valid NUL-terminated string for the duration of the call.
            let by_call = if unsafe { libc::truncate(p.as_ptr(), 0) } == 0 { 0 } else { errno() };
            let by_open = std::fs::OpenOptions::new().write(true).truncate(true).open(path);
            match (by_call, by_open) {
                (0, _) => Ok(json!({"via": "truncate"})),
                (_, Ok(_)) => Ok(json!({"via": "open O_TRUNC"})),
                (e, Err(_)) => Err(e),
            }
        }
        "mknod" => {
            let p = cstr(path);
            let dev = libc::makedev(1, 3);
            // SAFETY: `p` is a valid NUL-terminated string for the duration of the call.
            if unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o666, dev) } == 0 {
                Ok(json!({}))
            } else {
                Err(errno())
            }
        }
        "exec_setuid" => exec_setuid(path),
        // `count` opens of `path`, each refused: a flood of refusals.
        "open_flood" => {
            let count = num(args, "count", 1000);
            let refused = (0..count).filter(|_| std::fs::File::open(path).is_err()).count();
            Ok(json!({"refused": refused}))
        }
        "persist" => {
            let mut wrote = Vec::new();
            let mut results = serde_json::Map::new();
            for p in args["paths"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                let r = write_file(p);
                if r.is_ok() {
                    wrote.push(p.to_owned());
                }
                results.insert(p.to_owned(), json!(r.err()));
            }
            let cwd = std::env::current_dir().map(|d| d.to_string_lossy().into_owned()).ok();
            let own = write_file("persist-marker").is_ok();
            let v = json!({"attempt": case, "succeeded": !wrote.is_empty(), "wrote": wrote,
                           "errnos": results, "cwd": cwd, "cwd_writable": own});
            return v;
        }
        "messy_run_dir" => messy_run_dir(args),
        "exists" => std::fs::symlink_metadata(path).map(|_| json!({})).map_err(|e| io_errno(&e)),
        _ => Err(-1),
    };
    outcome(case, r)
}
