//! What a run's egress programs refused, read back from their maps (and
//! removed there: the maps are shared by the runs of one rule set, and a
//! slot's cgroup, whose id keys the counts, is reused by later runs).

use std::io;
use std::net::{IpAddr, SocketAddr};

use policy::egress::Protocol;

use super::program::{decode_key, DENIED_KEY_SIZE};
use crate::sys::bpf::{self, Map};

/// Most refused destinations listed in a report (the total counts all).
pub const MAX_LISTED: usize = 16;

/// One refused destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// `"127.0.0.3:8080"`, `"[::1]:80"`; `"*"` for a socket refused when
    /// made (ICMP, another protocol), before naming a destination.
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

/// `addr:port`; `*` for a socket refused when it was made (no destination
/// yet: counted under the unspecified address and port 0).
fn destination(addr: IpAddr, port: u16) -> String {
    if addr.is_unspecified() && port == 0 {
        return "*".to_owned();
    }
    SocketAddr::new(addr, port).to_string()
}

/// Every key of the denial map (at most `bound`: the map's own bound, and
/// a stop should the kernel's walk restart under a concurrent delete).
fn keys(denied: &Map, bound: usize) -> io::Result<Vec<[u8; DENIED_KEY_SIZE]>> {
    let mut out = Vec::new();
    let mut key = [0u8; DENIED_KEY_SIZE];
    while out.len() < bound {
        let prev = out.last().map(|k: &[u8; DENIED_KEY_SIZE]| &k[..]);
        if !bpf::map_next_key(denied, prev, &mut key)? {
            break;
        }
        out.push(key);
    }
    Ok(out)
}

/// Reads and removes the counts of the cgroup `cgroup_id`.
///
/// # Errors
///
/// The errno of a map read or delete.
pub fn take(denied: &Map, total: &Map, bound: usize, cgroup_id: u64) -> io::Result<Denials> {
    let mut all: Vec<Denied> = Vec::new();
    for key in keys(denied, bound)? {
        let (id, addr, port, proto) = decode_key(&key);
        let mut v = [0u8; 8];
        if id != cgroup_id || !bpf::map_lookup(denied, &key, &mut v)? {
            continue;
        }
        bpf::map_delete(denied, &key)?;
        let (destination, protocol) = (destination(addr, port), protocol_name(proto));
        let count = u64::from_ne_bytes(v);
        // IPv4 and IPv6 sockets refused when made print alike: one row.
        match all.iter_mut().find(|d| d.destination == destination && d.protocol == protocol) {
            Some(d) => d.count += count,
            None => all.push(Denied { destination, protocol, count }),
        }
    }
    all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.destination.cmp(&b.destination)));
    all.truncate(MAX_LISTED);
    let id = cgroup_id.to_ne_bytes();
    let mut v = [0u8; 8];
    let total = if bpf::map_lookup(total, &id, &mut v)? {
        bpf::map_delete(total, &id)?;
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
