//! Where a networked run may connect: `connect` entries (`"HOST:PORT"`,
//! `"10.0.0.0/8:443"`, `"[2001:db8::1]:53"`, `"example.com:*"`) parsed into
//! values that can only be valid, and the resolved [`rules::EgressRules`]
//! the kernel enforces.
//!
//! An entry's text is its [`Display`](fmt::Display): parsing what an entry
//! prints gives the same entry. IPv4-mapped IPv6 networks
//! (`[::ffff:10.0.0.0]/104`) are held as the IPv4 network they map, since
//! the kernel judges a v4-mapped destination by the IPv4 rules.

pub mod rules;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

pub use rules::{resolver_rules, EgressRules, Protocol, Rule, Step, DNS_PORT};

/// Longest DNS name (RFC 1035, without the trailing dot).
pub const MAX_DNS_NAME: usize = 253;
/// Longest DNS label.
pub const MAX_DNS_LABEL: usize = 63;

/// Why a `connect` entry is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// No `:PORT` at the end.
    #[error("\"{0}\": expected HOST:PORT (PORT a number or *)")]
    MissingPort(String),
    /// The port is not 1 to 65535 or `*`.
    #[error("\"{0}\": port must be 1 to 65535 or *")]
    BadPort(String),
    /// An IPv6 address outside brackets, or a bracket left open.
    #[error("\"{0}\": an IPv6 address goes in brackets: [2001:db8::1]:53")]
    Brackets(String),
    /// The address part is not an IP address.
    #[error("\"{0}\": not an IP address")]
    BadAddress(String),
    /// The prefix length is not a number within the family's width.
    #[error("\"{0}\": prefix length must be 0 to {1}")]
    BadPrefix(String, u8),
    /// Bits set past the prefix length.
    #[error("\"{0}\": address has bits set past the prefix (network is {1})")]
    HostBits(String, String),
    /// Not a DNS name: labels of letters, digits and inner hyphens.
    #[error("\"{0}\": not a DNS name or IP address")]
    BadName(String),
}

/// An IPv4 or IPv6 network: an address with no bits past its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cidr {
    /// An IPv4 network.
    V4(Ipv4Addr, u8),
    /// An IPv6 network (never within `::ffff:0:0/96` at a prefix of 96
    /// or more: those are held as [`Cidr::V4`]).
    V6(Ipv6Addr, u8),
}

impl Cidr {
    /// The network `addr/prefix`; `None` when the prefix is too long or
    /// bits are set past it. A v4-mapped IPv6 network becomes IPv4.
    #[must_use]
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let c = match addr {
            IpAddr::V4(a) if prefix <= 32 => Self::V4(a, prefix),
            IpAddr::V6(a) if prefix <= 128 => match a.to_ipv4_mapped() {
                Some(v4) if prefix >= 96 => Self::V4(v4, prefix - 96),
                _ => Self::V6(a, prefix),
            },
            _ => return None,
        };
        (c.network() == c).then_some(c)
    }

    /// The single address `addr` (/32 or /128).
    #[must_use]
    pub fn host(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(a) => Self::V4(a, 32),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Self::V4(v4, 32),
                None => Self::V6(a, 128),
            },
        }
    }

    /// This network with the bits past its prefix cleared.
    #[must_use]
    pub fn network(self) -> Self {
        match self {
            Self::V4(a, p) => Self::V4(Ipv4Addr::from(u32::from(a) & mask_v4(p)), p),
            Self::V6(a, p) => Self::V6(Ipv6Addr::from(u128::from(a) & mask_v6(p)), p),
        }
    }

    /// The prefix length.
    #[must_use]
    pub fn prefix(self) -> u8 {
        match self {
            Self::V4(_, p) | Self::V6(_, p) => p,
        }
    }

    /// Whether `addr` lies in this network (a v4-mapped IPv6 address is
    /// judged as the IPv4 address it maps).
    #[must_use]
    pub fn contains(self, addr: IpAddr) -> bool {
        match (self, unmap(addr)) {
            (Self::V4(n, p), IpAddr::V4(a)) => u32::from(a) & mask_v4(p) == u32::from(n),
            (Self::V6(n, p), IpAddr::V6(a)) => u128::from(a) & mask_v6(p) == u128::from(n),
            _ => false,
        }
    }

    /// Whether every address of `inner` lies in this network.
    #[must_use]
    pub fn covers(self, inner: Self) -> bool {
        match inner {
            Self::V4(a, p) => p >= self.prefix() && self.contains(IpAddr::V4(a)),
            Self::V6(a, p) => p >= self.prefix() && self.contains(IpAddr::V6(a)),
        }
    }
}

/// `addr`, or the IPv4 address it maps when it is `::ffff:a.b.c.d`.
#[must_use]
pub fn unmap(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        IpAddr::V4(_) => addr,
    }
}

/// The IPv4 netmask of a prefix length (at most 32).
#[must_use]
pub fn mask_v4(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0)
}

/// The IPv6 netmask of a prefix length (at most 128).
#[must_use]
pub fn mask_v6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix.min(128))).unwrap_or(0)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::V4(a, 32) => write!(f, "{a}"),
            Self::V4(a, p) => write!(f, "{a}/{p}"),
            Self::V6(a, 128) => write!(f, "[{a}]"),
            Self::V6(a, p) => write!(f, "[{a}]/{p}"),
        }
    }
}

/// A DNS name, lower case, without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsName(String);

impl DnsName {
    /// The name's text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DnsName {
    type Err = EntryError;

    fn from_str(s: &str) -> Result<Self, EntryError> {
        let bad = || EntryError::BadName(s.to_owned());
        let name = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        if name.is_empty() || name.len() > MAX_DNS_NAME {
            return Err(bad());
        }
        for label in name.split('.') {
            let ok_chars = label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if label.is_empty()
                || label.len() > MAX_DNS_LABEL
                || !ok_chars
                || label.starts_with('-')
                || label.ends_with('-')
            {
                return Err(bad());
            }
        }
        // A last label of digits only is a mistyped address, not a name.
        if name.rsplit('.').next().is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit())) {
            return Err(bad());
        }
        Ok(Self(name))
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an entry names: a network, or a DNS name resolved at run start.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// An address or network.
    Net(Cidr),
    /// A DNS name.
    Name(DnsName),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Net(c) => c.fmt(f),
            Self::Name(n) => n.fmt(f),
        }
    }
}

/// A destination port: one port, or any (`*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Port {
    /// Any port.
    Any,
    /// One port, 1 to 65535.
    One(std::num::NonZeroU16),
}

impl Port {
    /// Whether this port allows the destination port `p` of `protocol`.
    /// ICMP never: no rule allows ICMP echo, since the kernel does not
    /// judge where an unconnected ping socket sends (see [`Protocol::Icmp`]).
    #[must_use]
    pub fn allows(self, p: u16, protocol: Protocol) -> bool {
        protocol != Protocol::Icmp
            && match self {
                Self::Any => true,
                Self::One(n) => n.get() == p,
            }
    }

    /// Whether every port this one allows, `grant` allows too.
    #[must_use]
    pub fn covered_by(self, grant: Self) -> bool {
        grant == Self::Any || grant == self
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::One(p) => p.fmt(f),
        }
    }
}

/// One `connect` entry: where a run may connect.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct Entry {
    /// The destination network or name.
    pub host: Host,
    /// The destination port.
    pub port: Port,
}

impl Entry {
    /// Whether `grant` allows everything this entry asks for: the same
    /// name, or a network holding this one, and a port covering this one.
    /// A name never covers a network nor the reverse (what a name resolves
    /// to is known only when a run starts).
    #[must_use]
    pub fn covered_by(&self, grant: &Self) -> bool {
        let host = match (&self.host, &grant.host) {
            (Host::Net(mine), Host::Net(g)) => g.covers(*mine),
            (Host::Name(mine), Host::Name(g)) => mine == g,
            _ => false,
        };
        host && self.port.covered_by(grant.port)
    }
}

impl FromStr for Entry {
    type Err = EntryError;

    fn from_str(s: &str) -> Result<Self, EntryError> {
        let (host, port) = s.rsplit_once(':').ok_or_else(|| EntryError::MissingPort(s.into()))?;
        let port = parse_port(s, port)?;
        let host = if let Some(rest) = host.strip_prefix('[') {
            let (addr, tail) =
                rest.split_once(']').ok_or_else(|| EntryError::Brackets(s.into()))?;
            let addr: Ipv6Addr = addr.parse().map_err(|_| EntryError::BadAddress(s.into()))?;
            Host::Net(parse_net(s, IpAddr::V6(addr), tail)?)
        } else if host.contains(':') || host.contains(']') {
            return Err(EntryError::Brackets(s.into()));
        } else if host.bytes().next().is_some_and(|b| b.is_ascii_digit()) && looks_v4(host) {
            let (addr, tail) = host.find('/').map_or((host, ""), |i| host.split_at(i));
            let addr: Ipv4Addr = addr.parse().map_err(|_| EntryError::BadAddress(s.into()))?;
            Host::Net(parse_net(s, IpAddr::V4(addr), tail)?)
        } else {
            Host::Name(host.parse().map_err(|_| EntryError::BadName(s.into()))?)
        };
        Ok(Self { host, port })
    }
}

/// Digits, dots and one optional `/prefix`: meant as an IPv4 address.
fn looks_v4(host: &str) -> bool {
    host.bytes().all(|b| b.is_ascii_digit() || b == b'.' || b == b'/')
}

fn parse_port(s: &str, port: &str) -> Result<Port, EntryError> {
    if port == "*" {
        return Ok(Port::Any);
    }
    // Digits only: `u16::from_str` would also take a leading `+`.
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(EntryError::BadPort(s.into()));
    }
    port.parse()
        .ok()
        .and_then(std::num::NonZeroU16::new)
        .map(Port::One)
        .ok_or_else(|| EntryError::BadPort(s.into()))
}

/// `addr` with `tail` (empty, or `/N`) as a [`Cidr`].
fn parse_net(s: &str, addr: IpAddr, tail: &str) -> Result<Cidr, EntryError> {
    let width = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match tail {
        "" => width,
        t => {
            let digits = t.strip_prefix('/').ok_or_else(|| EntryError::Brackets(s.into()))?;
            if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(EntryError::BadPrefix(s.into(), width));
            }
            digits.parse::<u8>().map_err(|_| EntryError::BadPrefix(s.into(), width))?
        }
    };
    if prefix > width {
        return Err(EntryError::BadPrefix(s.into(), width));
    }
    let masked = match addr {
        IpAddr::V4(a) => Cidr::V4(a, prefix).network(),
        IpAddr::V6(a) => Cidr::V6(a, prefix).network(),
    };
    Cidr::new(addr, prefix).ok_or_else(|| EntryError::HostBits(s.into(), masked.to_string()))
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl TryFrom<String> for Entry {
    type Error = EntryError;

    fn try_from(s: String) -> Result<Self, EntryError> {
        s.parse()
    }
}

impl From<Entry> for String {
    fn from(e: Entry) -> Self {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str) -> Entry {
        s.parse().unwrap_or_else(|err| panic!("{s}: {err}"))
    }

    #[test]
    fn every_spelling_parses_and_round_trips() {
        for s in [
            "1.2.3.4:443",
            "10.0.0.0/8:443",
            "[2001:db8::1]:53",
            "[fd00::]/8:*",
            "example.com:443",
            "example.com:*",
            "0.0.0.0/0:443",
            "[::]/0:443",
            "127.0.0.1:8080",
            "[::1]:80",
        ] {
            assert_eq!(e(s).to_string(), s, "{s}");
            assert_eq!(e(&e(s).to_string()), e(s));
        }
    }

    #[test]
    fn values_are_what_the_text_says() {
        assert_eq!(
            e("10.0.0.0/8:443"),
            Entry {
                host: Host::Net(Cidr::V4(Ipv4Addr::new(10, 0, 0, 0), 8)),
                port: Port::One(std::num::NonZeroU16::new(443).unwrap()),
            }
        );
        assert_eq!(e("Example.COM.:*").to_string(), "example.com:*");
        assert_eq!(e("[fd00::]/8:*").port, Port::Any);
    }

    #[test]
    fn ipv6_zero_compression_is_one_value() {
        assert_eq!(e("[2001:0db8:0000:0000:0000:0000:0000:0001]:53"), e("[2001:db8::1]:53"));
        assert_eq!(e("[2001:db8:0:0::1]:53").to_string(), "[2001:db8::1]:53");
        assert_eq!(e("[0:0:0:0:0:0:0:1]:80").to_string(), "[::1]:80");
    }

    #[test]
    fn v4_mapped_spellings_are_held_as_ipv4() {
        assert_eq!(e("[::ffff:127.0.0.1]:80"), e("127.0.0.1:80"));
        assert_eq!(e("[::ffff:7f00:1]:80").to_string(), "127.0.0.1:80");
        assert_eq!(e("[::ffff:10.0.0.0]/104:*").to_string(), "10.0.0.0/8:*");
        assert_eq!(e("[::ffff:0:0]/96:443").to_string(), "0.0.0.0/0:443");
        // Shorter than the mapped range: stays IPv6.
        assert_eq!(e("[::]/64:443").to_string(), "[::]/64:443");
    }

    #[test]
    fn bad_entries_say_why() {
        type Is = fn(&EntryError) -> bool;
        let cases: &[(&str, Is)] = &[
            ("1.2.3.4", |x| matches!(x, EntryError::MissingPort(_))),
            ("host", |x| matches!(x, EntryError::MissingPort(_))),
            ("1.2.3.4:0", |x| matches!(x, EntryError::BadPort(_))),
            ("1.2.3.4:65536", |x| matches!(x, EntryError::BadPort(_))),
            ("1.2.3.4:+80", |x| matches!(x, EntryError::BadPort(_))),
            ("1.2.3.4:", |x| matches!(x, EntryError::BadPort(_))),
            ("2001:db8::1:53", |x| matches!(x, EntryError::Brackets(_))),
            ("[2001:db8::1:53", |x| matches!(x, EntryError::Brackets(_))),
            ("[2001:db8::g]:53", |x| matches!(x, EntryError::BadAddress(_))),
            ("1.2.3:80", |x| matches!(x, EntryError::BadAddress(_))),
            ("1.2.3.256:80", |x| matches!(x, EntryError::BadAddress(_))),
            ("10.0.0.0/33:80", |x| matches!(x, EntryError::BadPrefix(_, 32))),
            ("10.0.0.0/:80", |x| matches!(x, EntryError::BadPrefix(..))),
            ("[fd00::]/129:80", |x| matches!(x, EntryError::BadPrefix(_, 128))),
            ("[fd00::]x:80", |x| matches!(x, EntryError::Brackets(_))),
            ("10.0.0.1/8:80", |x| matches!(x, EntryError::HostBits(_, n) if n == "10.0.0.0/8")),
            ("[fd00::1]/8:80", |x| matches!(x, EntryError::HostBits(..))),
            ("-bad.com:80", |x| matches!(x, EntryError::BadName(_))),
            ("a..b:80", |x| matches!(x, EntryError::BadName(_))),
            ("under_score.com:80", |x| matches!(x, EntryError::BadName(_))),
            (":80", |x| matches!(x, EntryError::BadName(_))),
            ("example.123:80", |x| matches!(x, EntryError::BadName(_))),
        ];
        for (s, is) in cases {
            let err = s.parse::<Entry>().expect_err(s);
            assert!(is(&err), "{s}: {err:?}");
            assert!(err.to_string().contains(s), "{err}");
        }
        let long = format!("{}.com:80", "a".repeat(64));
        assert!(long.parse::<Entry>().is_err());
    }

    #[test]
    fn serde_uses_the_text() {
        let v: Vec<Entry> = serde_json::from_str(r#"["[::1]:53","a.b:*"]"#).unwrap();
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"["[::1]:53","a.b:*"]"#);
        assert!(serde_json::from_str::<Vec<Entry>>(r#"["nope"]"#).is_err());
    }

    #[test]
    fn covered_by_needs_a_wider_network_and_port() {
        assert!(e("10.1.2.3:443").covered_by(&e("10.0.0.0/8:443")));
        assert!(e("10.1.0.0/16:443").covered_by(&e("10.0.0.0/8:*")));
        assert!(!e("10.0.0.0/8:443").covered_by(&e("10.1.0.0/16:443")));
        assert!(!e("10.1.2.3:80").covered_by(&e("10.0.0.0/8:443")));
        assert!(!e("10.1.2.3:*").covered_by(&e("10.0.0.0/8:443")));
        assert!(e("[2001:db8::1]:53").covered_by(&e("[2001:db8::]/32:53")));
        assert!(!e("[2001:db8::1]:53").covered_by(&e("0.0.0.0/0:53")));
        assert!(e("[::ffff:10.1.2.3]:443").covered_by(&e("10.0.0.0/8:443")));
        assert!(e("example.com:443").covered_by(&e("EXAMPLE.com:*")));
        assert!(!e("example.com:443").covered_by(&e("0.0.0.0/0:443")));
        assert!(!e("1.2.3.4:443").covered_by(&e("example.com:443")));
        let grants = [e("10.0.0.0/8:443"), e("example.com:*")];
        let asked = [e("10.9.9.9:443"), e("example.com:22"), e("other.org:443")];
        let uncovered: Vec<&Entry> =
            asked.iter().filter(|r| !grants.iter().any(|g| r.covered_by(g))).collect();
        assert_eq!(uncovered, vec![&asked[2]]);
    }

    #[test]
    fn masks_and_contains() {
        assert_eq!(mask_v4(0), 0);
        assert_eq!(mask_v4(8), 0xff00_0000);
        assert_eq!(mask_v4(32), u32::MAX);
        assert_eq!(mask_v6(0), 0);
        assert_eq!(mask_v6(128), u128::MAX);
        let lo = Cidr::V4(Ipv4Addr::new(127, 0, 0, 0), 8);
        assert!(lo.contains("127.1.2.3".parse().unwrap()));
        assert!(lo.contains("::ffff:127.0.0.2".parse().unwrap()));
        assert!(!lo.contains("::1".parse().unwrap()));
        assert_eq!(Cidr::new("10.0.0.1".parse().unwrap(), 8), None);
        assert_eq!(Cidr::new("10.0.0.0".parse().unwrap(), 33), None);
        assert_eq!(Cidr::host("::ffff:1.2.3.4".parse().unwrap()).to_string(), "1.2.3.4");
    }
}
