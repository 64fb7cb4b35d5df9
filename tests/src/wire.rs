//! A blocking line client of the executor's wire (newline-delimited
//! JSON-RPC on its Unix socket), for tests that speak it directly.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

/// One connection; every read waits at most 20 s.
#[derive(Debug)]
pub struct Client {
    /// The connection, written to.
    pub stream: UnixStream,
    /// A duplicate of it, read from line by line.
    pub reader: BufReader<UnixStream>,
}

impl Client {
    /// Connects to `socket`.
    ///
    /// # Panics
    ///
    /// When the socket cannot be connected to.
    pub fn connect(socket: &Path) -> Client {
        let stream = UnixStream::connect(socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Client { stream, reader }
    }

    /// Sends `bytes` as they are.
    ///
    /// # Panics
    ///
    /// When the write fails.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Sends `v` as one line.
    ///
    /// # Panics
    ///
    /// When the write fails.
    pub fn send(&mut self, v: &Value) {
        let mut line = serde_json::to_vec(v).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// Sends an `execute` of `manifest` with `args` (session `t`).
    ///
    /// # Panics
    ///
    /// When the write fails.
    pub fn execute(&mut self, id: u64, manifest: &Path, args: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "execute",
            "params": {"manifest": manifest, "args": args, "session_id": "t"}}));
    }

    /// The next line, or `None` at end of file.
    ///
    /// # Panics
    ///
    /// When the read fails (or times out) or the line is not JSON.
    pub fn recv_opt(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(serde_json::from_str(&line).unwrap()),
            Err(e) => panic!("read: {e}"),
        }
    }

    /// The next line.
    ///
    /// # Panics
    ///
    /// As [`Client::recv_opt`], and at end of file.
    pub fn recv(&mut self) -> Value {
        self.recv_opt().expect("connection closed")
    }

    /// Reads the `stderr` notifications, then the report: the stderr lines
    /// and the report's line (an MCP tool call's `tools_generation`
    /// notification is passed over).
    ///
    /// # Panics
    ///
    /// As [`Client::recv`].
    pub fn run_result(&mut self) -> (Vec<String>, Value) {
        let mut stderr = Vec::new();
        loop {
            let v = self.recv();
            if v["method"] == "stderr" {
                stderr.push(v["params"]["line"].as_str().unwrap().to_owned());
            } else if v["method"] == "tools_generation" {
                continue;
            } else {
                return (stderr, v);
            }
        }
    }
}
