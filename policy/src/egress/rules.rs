//! A run's resolved egress rules: networks and ports it may reach, and the
//! default refusals that stand ahead of them.
//!
//! Loopback, the unspecified addresses (a connect to `0.0.0.0` or `::`
//! reaches the host itself), link-local (which holds the cloud metadata
//! services) and the host's own interface addresses are refused even under
//! a grant of every destination, unless an allow rule lies within the
//! refused range (`127.0.0.1:8080` opens that port of loopback;
//! `0.0.0.0/0:443` does not). The rules are an ordered list of [`Step`]s,
//! first match wins, nothing matched is refused: the kernel program walks
//! the same list.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{unmap, Cidr, Entry, Host, Port};

/// Most steps a rule set may hold (allow rules, refusals and the host's
/// addresses together): the kernel program grows with each, and the
/// verifier must accept it quickly.
pub const MAX_STEPS: usize = 256;

/// The transport a destination is reached by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP (connect, fast open).
    Tcp,
    /// UDP (connect, sendto).
    Udp,
    /// ICMP echo through a ping socket: always refused (the kernel runs
    /// no cgroup hook for a ping socket's `sendto`, so its destination
    /// cannot be held to the rules; the socket is refused when made).
    Icmp,
}

impl Protocol {
    /// The protocol of an IP protocol number (`IPPROTO_*`), if it is one
    /// of these three.
    #[must_use]
    pub fn from_number(n: u32) -> Option<Self> {
        match n {
            6 => Some(Self::Tcp),
            17 => Some(Self::Udp),
            1 | 58 => Some(Self::Icmp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Icmp => "icmp",
        })
    }
}

/// One allow rule: a network and a port (or any).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    /// The destination network.
    pub net: Cidr,
    /// The destination port.
    pub port: Port,
}

impl Rule {
    /// The rule of an entry that names a network; `None` for a DNS name
    /// (resolved by the executor into [`Rule::resolved`] rules).
    #[must_use]
    pub fn from_entry(e: &Entry) -> Option<Self> {
        match e.host {
            Host::Net(net) => Some(Self { net, port: e.port }),
            Host::Name(_) => None,
        }
    }

    /// The rules for the addresses a name entry resolved to.
    #[must_use]
    pub fn resolved(e: &Entry, addrs: &[IpAddr]) -> Vec<Self> {
        addrs.iter().map(|a| Self { net: Cidr::host(*a), port: e.port }).collect()
    }
}

/// One step of the ordered rule list: a destination in `net` on a port
/// `port` allows is allowed or refused; later steps are not looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The destination network.
    pub net: Cidr,
    /// The destination port (`Any` for a refusal).
    pub port: Port,
    /// Allowed (true) or refused.
    pub allow: bool,
}

/// Too many rules for one run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("egress: {0} rules with the default refusals, at most {MAX_STEPS}")]
pub struct TooManyRules(pub usize);

/// The networks refused unless an allow rule lies within them: loopback,
/// unspecified, link-local, multicast and the limited broadcast, IPv4 and
/// IPv6 (v4-mapped destinations are judged by the IPv4 ones), and the IPv6
/// address of AWS's instance metadata service (a unique-local one). A
/// broadcast or a multicast datagram is looped back to the host's own
/// sockets: it would reach the host's UDP services as its own addresses
/// would.
#[must_use]
pub fn default_refusals() -> [Cidr; 10] {
    [
        Cidr::V4(Ipv4Addr::new(127, 0, 0, 0), 8),
        Cidr::V4(Ipv4Addr::UNSPECIFIED, 8),
        Cidr::V4(Ipv4Addr::new(169, 254, 0, 0), 16),
        Cidr::V4(Ipv4Addr::new(224, 0, 0, 0), 4),
        Cidr::V4(Ipv4Addr::BROADCAST, 32),
        Cidr::V6(Ipv6Addr::LOCALHOST, 128),
        Cidr::V6(Ipv6Addr::UNSPECIFIED, 128),
        Cidr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
        Cidr::V6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
        Cidr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254), 128),
    ]
}

/// The entries of `requested` a run under `grants` would not reach (what
/// `validate` reports for a manifest's `connect` list): those no entry
/// covers (a name only by the same name), those within a default refusal
/// (loopback, `0.0.0.0/8`, link-local) covered only by entries wider than
/// it, which do not open it ([`default_refusals`]), and those on port 53
/// covered only by entries of any port ([`DNS_PORT`]; the resolvers of a
/// `dns = true` grant are not judged here). The host's own addresses are
/// known only when a run starts and are not judged either.
#[must_use]
pub fn unreachable<'a>(grants: &[Entry], requested: &'a [Entry]) -> Vec<&'a Entry> {
    let refusals = default_refusals();
    let opens = |asked: &Entry, grant: &Entry| {
        let refused = match asked.host {
            Host::Net(net) => refusals.iter().find(|r| r.covers(net)),
            Host::Name(_) => None,
        };
        let dns = asked.port == Port::One(dns_port());
        asked.covered_by(grant)
            && refused.is_none_or(|r| matches!(grant.host, Host::Net(g) if r.covers(g)))
            && (!dns || grant.port == Port::One(dns_port()))
    };
    requested.iter().filter(|r| !grants.iter().any(|g| opens(r, g))).collect()
}

/// The DNS port: reachable only through a rule that names it (the
/// resolvers of a `dns = true` grant, or an entry with `:53`), so a grant
/// of every destination is no way around the resolvers the operator chose.
pub const DNS_PORT: u16 = 53;

/// A run's resolved egress rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRules {
    steps: Vec<Step>,
    allow: Vec<Rule>,
}

impl EgressRules {
    /// The rules allowing `allow`, behind the default refusals and the
    /// refusal of each of `host_addrs` (the host's own addresses).
    ///
    /// # Errors
    ///
    /// [`TooManyRules`] past [`MAX_STEPS`].
    pub fn new(allow: &[Rule], host_addrs: &[IpAddr]) -> Result<Self, TooManyRules> {
        let mut refused: Vec<Cidr> = default_refusals().to_vec();
        for a in host_addrs {
            let c = Cidr::host(*a);
            if !refused.iter().any(|r| r.covers(c)) {
                refused.push(c);
            }
        }
        let mut allow = allow.to_vec();
        allow.sort_unstable();
        allow.dedup();
        let explicit = |r: &Rule| refused.iter().any(|x| x.covers(r.net));
        let dns = |r: &Rule| r.port == Port::One(dns_port());
        let step = |r: &Rule| Step { net: r.net, port: r.port, allow: true };
        let refuse = |net: Cidr, port: Port| Step { net, port, allow: false };
        // Port 53 first: the rules naming it (an explicit one ahead of the
        // default refusals on 53, which stand only when a wider rule names
        // 53), then no other destination on 53, whatever rule follows.
        let mut steps: Vec<Step> =
            allow.iter().filter(|r| dns(r) && explicit(r)).map(step).collect();
        if allow.iter().any(|r| dns(r) && !explicit(r)) {
            steps.extend(refused.iter().map(|&net| refuse(net, Port::One(dns_port()))));
            steps.extend(allow.iter().filter(|r| dns(r) && !explicit(r)).map(step));
        }
        steps.extend(
            [Cidr::V4(Ipv4Addr::UNSPECIFIED, 0), Cidr::V6(Ipv6Addr::UNSPECIFIED, 0)]
                .map(|net| refuse(net, Port::One(dns_port()))),
        );
        steps.extend(allow.iter().filter(|r| !dns(r) && explicit(r)).map(step));
        steps.extend(refused.iter().map(|&net| refuse(net, Port::Any)));
        steps.extend(allow.iter().filter(|r| !dns(r) && !explicit(r)).map(step));
        if steps.len() > MAX_STEPS {
            return Err(TooManyRules(steps.len()));
        }
        Ok(Self { steps, allow })
    }

    /// The ordered steps, first match wins, no match refused.
    #[must_use]
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The allow rules, sorted, without duplicates.
    #[must_use]
    pub fn allowed(&self) -> &[Rule] {
        &self.allow
    }

    /// Whether a packet or connection to `addr:port` over `protocol` is
    /// allowed (the reference the kernel program is tested against).
    #[must_use]
    pub fn decide(&self, addr: IpAddr, port: u16, protocol: Protocol) -> bool {
        let addr = unmap(addr);
        self.steps
            .iter()
            .find(|s| {
                s.net.contains(addr)
                    && if s.allow {
                        s.port.allows(port, protocol)
                    } else {
                        matches!(s.port, Port::Any)
                            || protocol != Protocol::Icmp && s.port.allows(port, protocol)
                    }
            })
            .is_some_and(|s| s.allow)
    }
}

fn dns_port() -> std::num::NonZeroU16 {
    std::num::NonZeroU16::new(DNS_PORT).unwrap_or(std::num::NonZeroU16::MIN)
}

/// The allow rules of a `dns = true` grant: each resolver on port 53.
#[must_use]
pub fn resolver_rules(resolvers: &[IpAddr]) -> Vec<Rule> {
    resolvers.iter().map(|a| Rule { net: Cidr::host(*a), port: Port::One(dns_port()) }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(entries: &[&str], host: &[&str]) -> EgressRules {
        let allow: Vec<Rule> =
            entries.iter().map(|s| Rule::from_entry(&s.parse().unwrap()).unwrap()).collect();
        let host: Vec<IpAddr> = host.iter().map(|a| a.parse().unwrap()).collect();
        EgressRules::new(&allow, &host).unwrap()
    }

    fn ok(r: &EgressRules, dest: &str, port: u16) -> bool {
        r.decide(dest.parse().unwrap(), port, Protocol::Tcp)
    }

    fn entry(s: &str) -> Entry {
        s.parse().unwrap()
    }

    #[test]
    fn a_default_refusal_is_opened_only_by_an_entry_within_it() {
        let any = [entry("0.0.0.0/0:*"), entry("[::]/0:*")];
        let asked = [
            entry("127.0.0.1:8080"),
            entry("[::1]:80"),
            entry("169.254.169.254:80"),
            entry("10.0.0.1:80"),
        ];
        let left = unreachable(&any, &asked);
        assert_eq!(left, vec![&asked[0], &asked[1], &asked[2]], "a grant of any destination");
        let named = [entry("127.0.0.0/8:*"), entry("[::1]:80"), entry("10.0.0.0/8:80")];
        assert_eq!(unreachable(&named, &asked), vec![&asked[2]], "entries within the refusals");
        let wide = [entry("0.0.0.0/0:443")];
        let asked =
            [entry("0.0.0.0/0:443"), entry("[::ffff:127.0.0.1]:443"), entry("example.com:443")];
        assert_eq!(unreachable(&wide, &asked), vec![&asked[1], &asked[2]]);
        let dns = [entry("10.0.0.1:53"), entry("10.0.0.2:53")];
        let grants = [entry("10.0.0.0/8:*"), entry("10.0.0.2:53")];
        assert_eq!(unreachable(&grants, &dns), vec![&dns[0]], "port 53 only where named");
    }

    #[test]
    fn any_destination_still_refuses_the_defaults() {
        let r = rules(&["0.0.0.0/0:*", "[::]/0:*"], &["192.0.2.7", "2001:db8::7"]);
        for d in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "::1",
            "::",
            "fe80::1",
            "febf::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "192.0.2.7",
            "::ffff:192.0.2.7",
            "2001:db8::7",
        ] {
            assert!(!ok(&r, d, 80), "{d}");
        }
        for d in ["10.0.0.1", "192.0.2.8", "::ffff:10.0.0.1", "2001:db8::8", "fec0::1"] {
            assert!(ok(&r, d, 80), "{d}");
        }
    }

    #[test]
    fn an_entry_within_a_refused_range_opens_exactly_itself() {
        let r = rules(&["127.0.0.1:8080", "0.0.0.0/0:443", "[fe80::]/64:*"], &["192.0.2.7"]);
        assert!(ok(&r, "127.0.0.1", 8080));
        assert!(ok(&r, "::ffff:127.0.0.1", 8080));
        assert!(!ok(&r, "127.0.0.1", 8081));
        assert!(!ok(&r, "127.0.0.2", 8080));
        assert!(!ok(&r, "127.0.0.1", 443));
        assert!(!ok(&r, "192.0.2.7", 443));
        assert!(ok(&r, "192.0.2.8", 443));
        assert!(ok(&r, "fe80::99", 1));
        assert!(!ok(&r, "fe80:0:0:1::99", 1));
        let host = rules(&["192.0.2.7:22"], &["192.0.2.7"]);
        assert!(ok(&host, "192.0.2.7", 22));
    }

    #[test]
    fn nothing_granted_refuses_everything() {
        let r = rules(&[], &[]);
        assert!(!ok(&r, "10.0.0.1", 443));
        assert!(!ok(&r, "2001:db8::1", 443));
    }

    #[test]
    fn icmp_is_never_allowed() {
        let r = rules(&["10.0.0.0/8:*", "0.0.0.0/0:443"], &[]);
        assert!(!r.decide("10.0.0.1".parse().unwrap(), 0, Protocol::Icmp));
        assert!(!r.decide("10.0.0.1".parse().unwrap(), 443, Protocol::Icmp));
        assert!(r.decide("10.0.0.1".parse().unwrap(), 0, Protocol::Udp));
    }

    #[test]
    fn steps_put_explicit_rules_then_refusals_first() {
        let r =
            rules(&["0.0.0.0/0:443", "127.0.0.1:80", "127.0.0.1:80"], &["127.0.0.1", "10.0.0.5"]);
        let s = r.steps();
        let n = default_refusals().len();
        assert_eq!(s.len(), 2 + 1 + n + 1 + 1, "{s:?}");
        assert!(s[..2].iter().all(|s| !s.allow && s.port.to_string() == "53"));
        assert!(s[2].allow && s[2].net.to_string() == "127.0.0.1");
        assert!(s[3..4 + n].iter().all(|s| !s.allow));
        assert_eq!(s[3 + n].net.to_string(), "10.0.0.5");
        assert!(s[4 + n].allow && s[4 + n].net.to_string() == "0.0.0.0/0");
        assert_eq!(r.allowed().len(), 2);
    }

    #[test]
    fn port_53_is_reachable_only_where_a_rule_names_it() {
        let mut allow: Vec<Rule> = ["0.0.0.0/0:*", "[::]/0:*", "192.0.2.9:53", "127.0.0.0/8:*"]
            .iter()
            .map(|s| Rule::from_entry(&s.parse().unwrap()).unwrap())
            .collect();
        allow.extend(resolver_rules(&["127.0.0.53".parse().unwrap(), "10.0.0.2".parse().unwrap()]));
        let r = EgressRules::new(&allow, &[]).unwrap();
        assert!(ok(&r, "127.0.0.53", 53));
        assert!(r.decide("10.0.0.2".parse().unwrap(), 53, Protocol::Udp));
        assert!(ok(&r, "192.0.2.9", 53));
        assert!(!ok(&r, "10.0.0.3", 53));
        assert!(!r.decide("2001:db8::1".parse().unwrap(), 53, Protocol::Udp));
        assert!(!ok(&r, "127.0.0.55", 53), "loopback granted, but not on 53");
        assert!(ok(&r, "127.0.0.55", 54));
        let wide = rules(&["0.0.0.0/0:53"], &[]);
        assert!(ok(&wide, "192.0.2.1", 53));
        assert!(!ok(&wide, "127.0.0.1", 53), "a wide rule on 53 opens no refused range");
        assert!(ok(&r, "10.0.0.3", 54));
        assert!(!r.decide("10.0.0.3".parse().unwrap(), 0, Protocol::Icmp));
    }

    #[test]
    fn too_many_rules_are_refused() {
        let allow: Vec<Rule> = (0..=MAX_STEPS)
            .map(|i| Rule {
                net: Cidr::host(IpAddr::V4(Ipv4Addr::from(
                    0x0a00_0000 + u32::try_from(i).unwrap(),
                ))),
                port: Port::Any,
            })
            .collect();
        assert!(matches!(EgressRules::new(&allow, &[]), Err(TooManyRules(_))));
    }

    #[test]
    fn names_resolve_into_host_rules() {
        let e: Entry = "example.com:443".parse().unwrap();
        assert_eq!(Rule::from_entry(&e), None);
        let addrs = ["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()];
        let r = Rule::resolved(&e, &addrs);
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].net.to_string(), "[2001:db8::1]");
        assert_eq!(Protocol::from_number(58), Some(Protocol::Icmp));
        assert_eq!(Protocol::from_number(6).map(|p| p.to_string()).as_deref(), Some("tcp"));
        assert_eq!(Protocol::from_number(99), None);
    }
}
