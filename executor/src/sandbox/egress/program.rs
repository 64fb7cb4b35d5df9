//! The egress programs, generated from a run's [`EgressRules`]: one
//! `BPF_PROG_TYPE_CGROUP_SOCK_ADDR` program per hook (`connect4`,
//! `connect6`, `sendmsg4`, `sendmsg6`) walking the rule steps in order, and
//! the `sock_create` program that lets the run make only TCP and UDP
//! sockets (no ping sockets, whose `sendto` no hook judges).
//!
//! A program returns 1 (allow) or 0 (refuse: the system call fails at once
//! with `EPERM`). Before refusing it counts the destination in the denial
//! map, keyed by [`DENIED_KEY_SIZE`] bytes: the cgroup id of the calling
//! process (`u64`: the programs of one rule set are shared by the runs
//! that have it, each run in its own cgroup), the family (`u32`, 4 or 6),
//! the address (16 bytes, an IPv4 one in the first 4), the port (network
//! order) and the IP protocol (`u16`, host order); and it adds 1 to the
//! cgroup's total in the total map, which counts refusals past the denial
//! map's bound too.

use std::net::IpAddr;

use policy::egress::{Cidr, EgressRules, Port, Step};

use super::asm::{Asm, AsmError, Cond, Label, Reg, R0, R1, R10, R2, R3, R4, R6, R7, R8};
use crate::sys::bpf::Insn;

/// `BPF_CGROUP_INET_SOCK_CREATE`.
pub const ATTACH_SOCK_CREATE: u32 = 2;
/// `BPF_CGROUP_INET_EGRESS`.
pub const ATTACH_INET_EGRESS: u32 = 1;
/// Bytes of a denial map key.
pub const DENIED_KEY_SIZE: usize = 32;
/// Bytes of a total map key: the cgroup id.
pub const TOTAL_KEY_SIZE: usize = 8;

// `struct bpf_sock_addr` field offsets (<linux/bpf.h>).
const USER_IP4: i16 = 4;
const USER_IP6: i16 = 8;
const USER_PORT: i16 = 24;
const PROTOCOL: i16 = 36;
// `struct bpf_sock`: `family`, `type`, `protocol`.
const SOCK_FAMILY: i16 = 4;
const SOCK_TYPE: i16 = 8;
const SOCK_PROTOCOL: i16 = 12;
const SOCK_STREAM: u32 = 1;
const SOCK_DGRAM: u32 = 2;
const AF_INET6: u32 = 10;
const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;

const IPPROTO_ICMP: u32 = 1;
const IPPROTO_ICMPV6: u32 = 58;
const HELPER_MAP_LOOKUP: i32 = 1;
const HELPER_MAP_UPDATE: i32 = 2;
const BPF_NOEXIST: i32 = 1;

const HELPER_GET_CURRENT_CGROUP_ID: i32 = 80;
const HELPER_SKB_LOAD_BYTES: i32 = 26;
const HELPER_SKB_CGROUP_ID: i32 = 79;

// `struct __sk_buff`: `protocol` (the link protocol, network order).
const SKB_PROTOCOL: i16 = 16;
/// `ETH_P_IP` and `ETH_P_IPV6` as `protocol` reads them.
const ETH_P_IP: u32 = 0x0800_u16.to_be() as u32;
const ETH_P_IPV6: u32 = 0x86dd_u16.to_be() as u32;
/// IPv6 extension headers: routing, hop-by-hop and destination options.
const IPPROTO_ROUTING: u32 = 43;
const IPPROTO_HOPOPTS: u32 = 0;
const IPPROTO_DSTOPTS: u32 = 60;
/// Bytes of the fixed IPv6 header.
const IPV6_HEADER: i32 = 40;
/// An IPv4 header's length in 32-bit words, no options.
const IPV4_IHL: u32 = 5;

// Stack slots below the frame pointer: the denial key (its first 8 bytes,
// the cgroup id, are the total map's key), and a first count. The key is
// written in whole, aligned 8-byte slots, two 32-bit fields composed in a
// register per slot: a narrower store into a slot the verifier tracks as a
// spilled register is refused without `CAP_PERFMON` on older kernels (6.1:
// "attempt to corrupt spilled pointer on stack").
const KEY: i16 = -32;
/// The family (low word) and address word 0.
const FAMILY_ADDR0: i16 = KEY + 8;
/// Address words 1 and 2.
const ADDR1_ADDR2: i16 = KEY + 16;
/// Address word 3 and `protocol << 16 | port`.
const ADDR3_PORT_PROTO: i16 = KEY + 24;
const ONE: i16 = -40;
/// A byte of the packet, read by `bpf_skb_load_bytes`.
const BYTE: i16 = -48;

/// A `CGROUP_SOCK_ADDR` hook the egress programs attach to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `connect(2)` on an `AF_INET` socket (TCP, UDP, ping).
    Connect4,
    /// `connect(2)` on an `AF_INET6` socket.
    Connect6,
    /// `sendmsg`/`sendto` with an address on an unconnected `AF_INET` UDP socket.
    Sendmsg4,
    /// The same on an `AF_INET6` socket.
    Sendmsg6,
}

impl Hook {
    /// Every hook, in attach order.
    pub const ALL: [Self; 4] = [Self::Connect4, Self::Connect6, Self::Sendmsg4, Self::Sendmsg6];

    /// Its `enum bpf_attach_type` value.
    #[must_use]
    pub fn attach_type(self) -> u32 {
        match self {
            Self::Connect4 => 10,
            Self::Connect6 => 11,
            Self::Sendmsg4 => 14,
            Self::Sendmsg6 => 15,
        }
    }

    /// The program's name (as `bpftool prog` shows it).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Connect4 => "ongrid_conn4",
            Self::Connect6 => "ongrid_conn6",
            Self::Sendmsg4 => "ongrid_send4",
            Self::Sendmsg6 => "ongrid_send6",
        }
    }

    fn v6(self) -> bool {
        matches!(self, Self::Connect6 | Self::Sendmsg6)
    }
}

/// The maps a program counts its refusals in (their descriptors).
#[derive(Debug, Clone, Copy)]
pub struct Maps {
    /// Hash map: denial key to `u64` count.
    pub denied: i32,
    /// Array map of one `u64`: every refusal.
    pub total: i32,
}

/// A 32-bit word as the program loads it from network-order memory.
fn ne(bytes: [u8; 4]) -> u32 {
    u32::from_ne_bytes(bytes)
}

/// The port as the program loads `user_port` (network order in memory).
fn port_word(p: u16) -> u32 {
    u32::from(u16::from_ne_bytes(p.to_be_bytes()))
}

/// The program for `hook` enforcing `rules`.
///
/// # Errors
///
/// [`AsmError`] when a jump would not fit (far more steps than allowed).
pub fn sock_addr(rules: &EgressRules, hook: Hook, maps: Maps) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let deny = a.label();
    a.mov64(R6, R1);
    a.ldx_w(R7, R6, USER_PORT);
    a.ldx_w(R8, R6, PROTOCOL);
    // No rule allows ICMP (ping sockets are refused when made; should one
    // reach a connect, it is refused here too).
    a.jmp32_imm(Cond::Eq, R8, IPPROTO_ICMP, deny);
    a.jmp32_imm(Cond::Eq, R8, IPPROTO_ICMPV6, deny);
    if hook.v6() {
        let native = a.label();
        for (i, r) in [R1, R2, R3, R4].into_iter().enumerate() {
            a.ldx_w(r, R6, USER_IP6 + 4 * i16::try_from(i).unwrap_or(0));
        }
        // `::ffff:a.b.c.d` is judged by the IPv4 rules.
        a.jmp32_imm(Cond::Ne, R1, 0, native);
        a.jmp32_imm(Cond::Ne, R2, 0, native);
        a.jmp32_imm(Cond::Ne, R3, ne([0, 0, 0xff, 0xff]), native);
        a.mov32(R1, R4);
        steps(&mut a, rules.steps(), false, deny);
        a.bind(native);
        steps(&mut a, rules.steps(), true, deny);
    } else {
        a.ldx_w(R1, R6, USER_IP4);
        steps(&mut a, rules.steps(), false, deny);
    }
    a.bind(deny);
    record_denial(&mut a, hook.v6(), maps);
    a.mov64_imm(R0, 0);
    a.exit();
    a.finish()
}

/// The steps of one family, the address in `r1` (IPv4) or `r1`..`r4`
/// (IPv6); falling off the end refuses.
fn steps(a: &mut Asm, steps: &[Step], v6: bool, deny: Label) {
    for s in steps {
        let words: Vec<(u32, u32)> = match (s.net, v6) {
            (Cidr::V4(n, p), false) => vec![(ne(n.octets()), policy::egress::mask_v4(p).to_be())],
            (Cidr::V6(n, p), true) => {
                let (o, m) = (n.octets(), policy::egress::mask_v6(p).to_be_bytes());
                (0..4)
                    .map(|i| {
                        let w =
                            |b: [u8; 16]| ne([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
                        (w(o), w(m))
                    })
                    .collect()
            }
            _ => continue,
        };
        let next = a.label();
        for ((net, mask), reg) in words.into_iter().zip([R1, R2, R3, R4]) {
            match_word(a, reg, net, mask, next);
        }
        if let Port::One(p) = s.port {
            a.jmp32_imm(Cond::Ne, R7, port_word(p.get()), next);
        }
        if s.allow {
            a.mov64_imm(R0, 1);
            a.exit();
        } else {
            a.ja(deny);
        }
        a.bind(next);
    }
}

/// `if ((wreg & mask) != net) goto next`; nothing for an empty mask.
/// `mask` is in load order (`ne` of the mask's network-order bytes);
/// for IPv4 `mask_v4(p).to_be()` is the same value.
fn match_word(a: &mut Asm, reg: Reg, net: u32, mask: u32, next: Label) {
    if mask == 0 {
        return;
    }
    if mask == u32::MAX {
        a.jmp32_imm(Cond::Ne, reg, net, next);
    } else {
        a.mov32(R0, reg);
        a.and32_imm(R0, mask);
        a.jmp32_imm(Cond::Ne, R0, net, next);
    }
}

/// Builds the denial key of the refused destination and counts it.
fn record_denial(a: &mut Asm, v6: bool, maps: Maps) {
    a.call(HELPER_GET_CURRENT_CGROUP_ID);
    a.stx_dw(R10, KEY, R0);
    a.mov64_imm(R1, if v6 { 6 } else { 4 });
    if v6 {
        a.ldx_w(R2, R6, USER_IP6);
        store_pair(a, FAMILY_ADDR0, R1, R2);
        a.ldx_w(R1, R6, USER_IP6 + 4);
        a.ldx_w(R2, R6, USER_IP6 + 8);
        store_pair(a, ADDR1_ADDR2, R1, R2);
        a.ldx_w(R1, R6, USER_IP6 + 12);
    } else {
        a.ldx_w(R2, R6, USER_IP4);
        store_pair(a, FAMILY_ADDR0, R1, R2);
        a.st_dw(R10, ADDR1_ADDR2, 0);
        a.mov64_imm(R1, 0);
    }
    a.mov32(R2, R8);
    a.lsh32_imm(R2, 16);
    a.or32(R2, R7);
    store_pair(a, ADDR3_PORT_PROTO, R1, R2);
    count_key(a, maps.denied);
    count_key(a, maps.total);
}

/// Stores the 32-bit values in `first` and `second` (upper halves clear)
/// as one 8-byte slot at `off`, `first` at the lower address; `second` is
/// clobbered.
fn store_pair(a: &mut Asm, off: i16, first: Reg, second: Reg) {
    let (low, high) =
        if cfg!(target_endian = "little") { (first, second) } else { (second, first) };
    a.lsh64_imm(high, 32);
    a.or64(low, high);
    a.stx_dw(R10, off, low);
}

/// Adds 1 to the count of the key on the stack in `map` (both maps' keys
/// start at [`KEY`]), making it with a count of 1 when absent; when a
/// racing refusal made it first, counts into that one.
fn count_key(a: &mut Asm, map: i32) {
    let (insert, done) = (a.label(), a.label());
    increment(a, map, insert, done);
    a.bind(insert);
    a.st_dw(R10, ONE, 1);
    a.ld_map_fd(R1, map);
    a.mov64(R2, R10);
    a.add64_imm(R2, KEY.into());
    a.mov64(R3, R10);
    a.add64_imm(R3, ONE.into());
    a.mov64_imm(R4, BPF_NOEXIST);
    a.call(HELPER_MAP_UPDATE);
    a.jmp_imm(Cond::Eq, R0, 0, done);
    increment(a, map, done, done);
    a.bind(done);
}

/// Adds 1 to the `u64` value of the key at [`KEY`] in `map`, then goes to
/// `then`; to `absent` when the map holds no such key.
fn increment(a: &mut Asm, map: i32, absent: Label, then: Label) {
    a.ld_map_fd(R1, map);
    a.mov64(R2, R10);
    a.add64_imm(R2, KEY.into());
    a.call(HELPER_MAP_LOOKUP);
    a.jmp_imm(Cond::Eq, R0, 0, absent);
    a.mov64_imm(R1, 1);
    a.atomic_add64(R0, 0, R1);
    a.ja(then);
}

/// The `cgroup_skb` egress program dropping the run's packets that carry
/// a source route: an IPv6 routing header (the kernel sends such a packet
/// to the header's address, not to the one the address hooks judged),
/// found behind up to two hop-by-hop or destination options headers (a
/// sender with `CAP_NET_RAW` may put them first, as the kernel orders
/// them), or IPv4 options (loose and strict source routes among them).
/// Seccomp refuses setting them as socket options; this also holds the
/// ones a `sendmsg` passes as control data (a Mobile IPv6 header, options
/// with `CAP_NET_RAW`). Each drop is counted under the unspecified address
/// and port 0 of its family, with the protocol 43 (`ip:43`) for IPv6 and 0
/// for IPv4; a UDP send fails with `EPERM`, a TCP segment is dropped (its
/// connect waits out its retries).
///
/// # Errors
///
/// [`AsmError`], which a fixed program never hits.
pub fn no_source_routes(maps: Maps) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let (allow, v6, routed, refuse) = (a.label(), a.label(), a.label(), a.label());
    a.mov64(R6, R1);
    a.ldx_w(R7, R1, SKB_PROTOCOL);
    a.jmp32_imm(Cond::Eq, R7, ETH_P_IPV6, v6);
    a.jmp32_imm(Cond::Ne, R7, ETH_P_IP, allow);
    // IPv4: the header's length, the low half of its first byte.
    a.mov64_imm(R7, 0);
    load_byte(&mut a, 0, allow);
    a.and32_imm(R1, 0x0f);
    a.jmp32_imm(Cond::Eq, R1, IPV4_IHL, allow);
    a.mov64_imm(R7, 4);
    a.mov64_imm(R8, 0);
    a.ja(refuse);
    // IPv6: `r8` the header type at offset `r7`, from the fixed header's
    // next header on; an options header's own next header and length
    // lead on to the one after it.
    a.bind(v6);
    a.mov64_imm(R7, 6);
    load_byte(&mut a, 0, allow);
    a.mov64(R8, R1);
    a.mov64_imm(R7, IPV6_HEADER);
    for _ in 0..2 {
        let options = a.label();
        a.jmp32_imm(Cond::Eq, R8, IPPROTO_ROUTING, routed);
        a.jmp32_imm(Cond::Eq, R8, IPPROTO_HOPOPTS, options);
        a.jmp32_imm(Cond::Ne, R8, IPPROTO_DSTOPTS, allow);
        a.bind(options);
        load_byte(&mut a, 0, allow);
        a.mov64(R8, R1);
        load_byte(&mut a, 1, allow);
        a.add64_imm(R1, 1);
        a.lsh64_imm(R1, 3);
        a.add64(R7, R1);
    }
    a.jmp32_imm(Cond::Ne, R8, IPPROTO_ROUTING, allow);
    a.bind(routed);
    a.mov64_imm(R7, 6);
    a.mov64_imm(R8, IPPROTO_ROUTING as i32);
    a.bind(refuse);
    // The socket's cgroup: a packet may leave from a timer, not the run.
    a.mov64(R1, R6);
    a.call(HELPER_SKB_CGROUP_ID);
    a.stx_dw(R10, KEY, R0);
    a.mov64(R1, R7);
    refuse_unaddressed(&mut a, maps, allow);
    a.finish()
}

/// `r1` = the packet's byte at `r7 + offset` (the skb in `r6`), or to
/// `failed` when it cannot be read.
fn load_byte(a: &mut Asm, offset: i32, failed: Label) {
    a.mov64(R1, R6);
    a.mov64(R2, R7);
    a.add64_imm(R2, offset);
    a.mov64(R3, R10);
    a.add64_imm(R3, BYTE.into());
    a.mov64_imm(R4, 1);
    a.call(HELPER_SKB_LOAD_BYTES);
    a.jmp_imm(Cond::Ne, R0, 0, failed);
    a.ldx_b(R1, R10, BYTE);
}

/// The `sock_create` program letting the run make only TCP and UDP
/// sockets (stream and datagram ones: not raw) in `AF_INET`/`AF_INET6`,
/// the two whose destinations the address hooks judge; each refusal counted under the unspecified address and
/// port 0 of its family, with the protocol asked for.
///
/// ICMP (ping) sockets are among those refused, whatever the rules: the
/// kernel runs the `connect4`/`connect6` hooks for a ping socket's
/// `connect` but no `sendmsg` hook for its `sendto` (seen on 6.18: an echo
/// to a refused loopback address went through while ping sockets were
/// allowed), so an unconnected ping socket could reach any destination.
/// Other IP protocols (SCTP, UDP-Lite, MPTCP) are not known to run both
/// hooks on every path out, so they are refused too.
///
/// # Errors
///
/// [`AsmError`], which a fixed program never hits.
pub fn only_tcp_and_udp_sockets(maps: Maps) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let (allow, key, typed, refuse) = (a.label(), a.label(), a.label(), a.label());
    a.ldx_w(R8, R1, SOCK_PROTOCOL);
    a.ldx_w(R7, R1, SOCK_FAMILY);
    a.ldx_w(R6, R1, SOCK_TYPE);
    // A raw socket of protocol TCP or UDP (`CAP_NET_RAW`) sends packets
    // no address hook judges: only stream and datagram sockets.
    a.jmp32_imm(Cond::Eq, R6, SOCK_STREAM, typed);
    a.jmp32_imm(Cond::Ne, R6, SOCK_DGRAM, refuse);
    a.bind(typed);
    a.jmp32_imm(Cond::Eq, R8, IPPROTO_TCP, allow);
    a.jmp32_imm(Cond::Eq, R8, IPPROTO_UDP, allow);
    a.bind(refuse);
    a.call(HELPER_GET_CURRENT_CGROUP_ID);
    a.stx_dw(R10, KEY, R0);
    a.mov64_imm(R1, 4);
    a.jmp32_imm(Cond::Ne, R7, AF_INET6, key);
    a.mov64_imm(R1, 6);
    a.bind(key);
    refuse_unaddressed(&mut a, maps, allow);
    a.finish()
}

/// The end of a program refusing what names no destination: with the
/// cgroup id at [`KEY`], the family (4 or 6) in `r1` and the IP protocol
/// in `r8`, counts the refusal under the family's unspecified address and
/// port 0 and returns 0; `allow` returns 1.
fn refuse_unaddressed(a: &mut Asm, maps: Maps, allow: Label) {
    a.mov64_imm(R2, 0);
    store_pair(a, FAMILY_ADDR0, R1, R2);
    a.st_dw(R10, ADDR1_ADDR2, 0);
    a.mov64_imm(R1, 0);
    a.mov32(R2, R8);
    a.lsh32_imm(R2, 16);
    store_pair(a, ADDR3_PORT_PROTO, R1, R2);
    count_key(a, maps.denied);
    count_key(a, maps.total);
    a.mov64_imm(R0, 0);
    a.exit();
    a.bind(allow);
    a.mov64_imm(R0, 1);
    a.exit();
}

/// The cgroup id a denial key was counted for, the destination it names,
/// and its port and IP protocol.
#[must_use]
pub fn decode_key(key: &[u8; DENIED_KEY_SIZE]) -> (u64, IpAddr, u16, u32) {
    let word = |i: usize| u32::from_ne_bytes([key[i], key[i + 1], key[i + 2], key[i + 3]]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&key[..8]);
    let mut a = [0u8; 16];
    a.copy_from_slice(&key[12..28]);
    let addr = if word(8) == 6 { IpAddr::from(a) } else { IpAddr::from([a[0], a[1], a[2], a[3]]) };
    // The word the program stored: protocol << 16 | user_port as loaded.
    let w = word(28);
    let loaded = u16::try_from(w & 0xffff).unwrap_or(0);
    (u64::from_ne_bytes(id), addr, u16::from_be_bytes(loaded.to_ne_bytes()), w >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::egress::Rule;

    fn rules(n: usize) -> EgressRules {
        let allow: Vec<Rule> = (0..n)
            .map(|i| {
                let s = if i % 2 == 0 {
                    format!("10.{i}.0.0/16:{}", 1000 + i)
                } else {
                    format!("[2001:db8:{i:x}::]/48:*")
                };
                Rule::from_entry(&s.parse().unwrap()).unwrap()
            })
            .collect();
        EgressRules::new(&allow, &["192.0.2.1".parse().unwrap()]).unwrap()
    }

    #[test]
    fn thirty_two_rules_stay_small() {
        let maps = Maps { denied: 3, total: 4 };
        for hook in Hook::ALL {
            let p = sock_addr(&rules(32), hook, maps).unwrap();
            assert!(p.len() < 1024, "{hook:?}: {}", p.len());
            assert_eq!(p.last().map(|i| i.code), Some(0x95));
        }
    }

    #[test]
    fn port_and_ipv4_words_are_in_load_order() {
        assert_eq!(port_word(80).to_ne_bytes()[..2], [0, 80]);
        assert_eq!(ne([127, 0, 0, 1]).to_ne_bytes(), [127, 0, 0, 1]);
        assert_eq!(policy::egress::mask_v4(8).to_be().to_ne_bytes(), [255, 0, 0, 0]);
    }

    #[test]
    fn keys_decode_back() {
        let mut k = [0u8; DENIED_KEY_SIZE];
        k[..8].copy_from_slice(&77u64.to_ne_bytes());
        k[8..12].copy_from_slice(&4u32.to_ne_bytes());
        k[12..16].copy_from_slice(&[127, 0, 0, 3]);
        k[28..32].copy_from_slice(&(6 << 16 | port_word(8080)).to_ne_bytes());
        assert_eq!(decode_key(&k), (77, "127.0.0.3".parse().unwrap(), 8080, 6));
        k[8..12].copy_from_slice(&6u32.to_ne_bytes());
        k[12..28].copy_from_slice(&"::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        assert_eq!(decode_key(&k).1, "::1".parse::<IpAddr>().unwrap());
    }

    /// Every store to the stack is a whole, aligned 8-byte slot, which
    /// every kernel's verifier accepts without `CAP_PERFMON`.
    fn assert_whole_stack_slots(p: &[Insn], what: &str) {
        for (i, insn) in p.iter().enumerate() {
            let class = insn.code & 0x07;
            let to_stack = matches!(class, 0x02 | 0x03) && insn.regs & 0x0f == 10;
            if to_stack {
                assert_eq!(insn.code & 0x18, 0x18, "{what}: insn {i} stores fewer than 8 bytes");
                assert_eq!(insn.off % 8, 0, "{what}: insn {i} stores at unaligned {}", insn.off);
            }
        }
    }

    #[test]
    fn stack_stores_fill_whole_slots() {
        let maps = Maps { denied: 3, total: 4 };
        for hook in Hook::ALL {
            assert_whole_stack_slots(&sock_addr(&rules(4), hook, maps).unwrap(), hook.name());
        }
        assert_whole_stack_slots(&only_tcp_and_udp_sockets(maps).unwrap(), "sock_create");
    }

    #[test]
    fn the_socket_filter_is_small() {
        let p = only_tcp_and_udp_sockets(Maps { denied: 3, total: 4 }).unwrap();
        assert!(p.len() < 160, "{}", p.len());
    }
}
