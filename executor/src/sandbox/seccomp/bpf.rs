//! The classic BPF a seccomp filter is written in: the instruction type,
//! the opcodes and return values the policy uses, the offsets of
//! `struct seccomp_data`, and (for the tests) an interpreter of those
//! instructions.

/// One classic BPF instruction (same layout as `struct sock_filter`).
pub type Insn = libc::sock_filter;

pub(super) const LD_W_ABS: u16 = 0x20;
pub(super) const JEQ_K: u16 = 0x15;
pub(super) const JGE_K: u16 = 0x35;
pub(super) const JSET_K: u16 = 0x45;
pub(super) const RET_K: u16 = 0x06;
pub(super) const JA: u16 = 0x05;
pub(super) const ALU_AND_K: u16 = 0x54;

pub(super) const RET_KILL_PROCESS: u32 = 0x8000_0000;
pub(super) const RET_ERRNO: u32 = 0x0005_0000;
pub(super) const RET_ALLOW: u32 = 0x7fff_0000;

pub(super) const OFF_NR: u32 = 0;
pub(super) const OFF_ARCH: u32 = 4;
pub(super) const fn off_arg_lo(i: u32) -> u32 {
    16 + 8 * i
}

/// A statement: `code` with operand `k`.
pub(super) fn stmt(code: u16, k: u32) -> Insn {
    Insn { code, jt: 0, jf: 0, k }
}

/// A conditional jump: `code` against `k`, skipping `jt` instructions
/// when it holds and `jf` when not.
pub(super) fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Insn {
    Insn { code, jt, jf, k }
}

/// An interpreter of the instructions above, for the policy's tests.
#[cfg(test)]
pub(super) mod interpret {
    use super::*;

    /// A tiny interpreter for the instructions the policy emits.
    pub(in crate::sandbox::seccomp) fn run(p: &[Insn], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        run_counted(p, arch, nr, args).0
    }

    /// The verdict and the number of instructions executed.
    pub(in crate::sandbox::seccomp) fn run_counted(
        p: &[Insn],
        arch: u32,
        nr: u32,
        args: [u64; 6],
    ) -> (u32, usize) {
        let mut steps = 0;
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = p[pc];
            steps += 1;
            let k = i.k as usize;
            match i.code {
                LD_W_ABS => acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap()),
                ALU_AND_K => acc &= i.k,
                RET_K => return (i.k, steps),
                JA => pc += k,
                JEQ_K | JGE_K | JSET_K => {
                    let hit = match i.code {
                        JEQ_K => acc == i.k,
                        JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if hit { i.jt } else { i.jf });
                }
                c => panic!("unexpected opcode {c:#x}"),
            }
            pc += 1;
        }
    }
}
