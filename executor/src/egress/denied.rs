//! What a run's egress programs refused, read back from their maps.

use std::io;
use std::net::{IpAddr, SocketAddr};

use policy::egress::Protocol;

use super::program::{decode_key, DENIED_KEY_SIZE};
use crate::sys::bpf::{self, Map};

/// Most refused destinations listed in a report (the total counts all).
pub const MAX_LISTED: usize = 16;
/// Most keys read from a denial map: its bound, and a stop should the
/// kernel's key walk restart (a key deleted under it).
const MAX_KEYS: usize = 1024;

/// One refused destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// `"127.0.0.3:8080"`, `"[::1]:80"`; `"*"` for ICMP sockets refused
    /// when made, before naming a destination.
    pub destination: String,
    /// `tcp`, `udp`, `icmp`, or `ip:N` for another IP protocol.
    pub protocol: String,
    /// How many times it was refused.
    pub count: u64,
}

/// The refusals of a run: the most refused destinations, then the total.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Denials {
    /// At most [`MAX_LISTED`], most refused first.
    pub listed: Vec<Denied>,
    /// Every refusal, listed or not (and past the map's bound).
    pub total: u64,
}

fn protocol_name(n: u32) -> String {
    Protocol::from_number(n).map_or_else(|| format!("ip:{n}"), |p| p.to_string())
}

/// `addr:port`; `*` for an ICMP socket refused when it was made (no
/// destination yet: counted under the unspecified address and port 0).
fn destination(addr: IpAddr, port: u16) -> String {
    if addr.is_unspecified() && port == 0 {
        return "*".to_owned();
    }
    SocketAddr::new(addr, port).to_string()
}

/// Reads the denial map and the total.
///
/// # Errors
///
/// The errno of a map read.
pub fn read(denied: &Map, total: &Map) -> io::Result<Denials> {
    let mut all = Vec::new();
    let mut key = [0u8; DENIED_KEY_SIZE];
    let mut prev: Option<[u8; DENIED_KEY_SIZE]> = None;
    while all.len() < MAX_KEYS
        && bpf::map_next_key(denied, prev.as_ref().map(|k| &k[..]), &mut key)?
    {
        let mut v = [0u8; 8];
        if bpf::map_lookup(denied, &key, &mut v)? {
            let (addr, port, proto) = decode_key(&key);
            all.push(Denied {
                destination: destination(addr, port),
                protocol: protocol_name(proto),
                count: u64::from_ne_bytes(v),
            });
        }
        prev = Some(key);
    }
    // IPv4 and IPv6 ICMP sockets refused when made print alike: one row.
    all.sort_by(|a, b| (&a.destination, &a.protocol).cmp(&(&b.destination, &b.protocol)));
    all.dedup_by(|later, kept| {
        let same = later.destination == kept.destination && later.protocol == kept.protocol;
        if same {
            kept.count += later.count;
        }
        same
    });
    all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.destination.cmp(&b.destination)));
    all.truncate(MAX_LISTED);
    let mut v = [0u8; 8];
    let total = if bpf::map_lookup(total, &0u32.to_ne_bytes(), &mut v)? {
        u64::from_ne_bytes(v)
    } else {
        0
    };
    Ok(Denials { listed: all, total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_destinations_print_as_reported() {
        assert_eq!(protocol_name(6), "tcp");
        assert_eq!(protocol_name(1), "icmp");
        assert_eq!(protocol_name(132), "ip:132");
        assert_eq!(destination("127.0.0.3".parse().unwrap(), 8080), "127.0.0.3:8080");
        assert_eq!(destination("::1".parse().unwrap(), 80), "[::1]:80");
        assert_eq!(destination("::".parse().unwrap(), 0), "*");
        assert_eq!(destination("0.0.0.0".parse().unwrap(), 1), "0.0.0.0:1");
        assert_eq!(destination("::ffff:127.0.0.2".parse().unwrap(), 80), "[::ffff:127.0.0.2]:80");
    }
}
