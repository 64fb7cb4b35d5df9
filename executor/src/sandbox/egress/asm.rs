//! A small eBPF assembler: the instructions the egress programs use, with
//! forward jumps to labels the assembler resolves when the program ends.

use crate::sys::bpf::Insn;

// Instruction classes.
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const ALU: u8 = 0x04;
const JMP: u8 = 0x05;
const JMP32: u8 = 0x06;
const ALU64: u8 = 0x07;
// Sizes.
const W: u8 = 0x00;
const B: u8 = 0x10;
const DW: u8 = 0x18;
// Modes.
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const ATOMIC: u8 = 0xc0;
// ALU operations.
const ADD: u8 = 0x00;
const OR: u8 = 0x40;
const AND: u8 = 0x50;
const LSH: u8 = 0x60;
const MOV: u8 = 0xb0;
// Operand source: immediate or register.
const K: u8 = 0x00;
const X: u8 = 0x08;
// Jump operations.
const JA: u8 = 0x00;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
/// `BPF_PSEUDO_MAP_FD`: a 64-bit immediate load whose value is a map fd.
const PSEUDO_MAP_FD: u8 = 1;

/// A register, `r0` to `r10` (`r10` the read-only frame pointer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(u8);

/// Return value, scratch.
pub const R0: Reg = Reg(0);
/// Context on entry; first helper argument.
pub const R1: Reg = Reg(1);
/// Second helper argument.
pub const R2: Reg = Reg(2);
/// Third helper argument.
pub const R3: Reg = Reg(3);
/// Fourth helper argument.
pub const R4: Reg = Reg(4);
/// Kept across helper calls.
pub const R6: Reg = Reg(6);
/// Kept across helper calls.
pub const R7: Reg = Reg(7);
/// Kept across helper calls.
pub const R8: Reg = Reg(8);
/// The frame pointer (stack grows down from it).
pub const R10: Reg = Reg(10);

/// A conditional jump's comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// Equal.
    Eq = 0x10,
    /// Not equal.
    Ne = 0x50,
}

/// A jump target, bound to one instruction with [`Asm::bind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// Why a program could not be assembled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AsmError {
    /// A jump to a label never bound.
    #[error("eBPF assembler: label {0} never bound")]
    Unbound(usize),
    /// A jump farther than a 16-bit offset reaches.
    #[error("eBPF assembler: jump from {0} out of range")]
    TooFar(usize),
}

/// An eBPF program being written.
#[derive(Debug, Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    jumps: Vec<(usize, Label)>,
}

fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn { code, regs: dst.0 | (src.0 << 4), off, imm }
}

impl Asm {
    /// An empty program.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, i: Insn) {
        self.insns.push(i);
    }

    /// A new label, not yet bound.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `l` to the next instruction written.
    pub fn bind(&mut self, l: Label) {
        if let Some(slot) = self.labels.get_mut(l.0) {
            *slot = Some(self.insns.len());
        }
    }

    /// `dst = src` (64 bits).
    pub fn mov64(&mut self, dst: Reg, src: Reg) {
        self.push(insn(ALU64 | MOV | X, dst, src, 0, 0));
    }

    /// `dst = imm` (64 bits, sign-extended).
    pub fn mov64_imm(&mut self, dst: Reg, imm: i32) {
        self.push(insn(ALU64 | MOV | K, dst, R0, 0, imm));
    }

    /// `dst += src` (64 bits).
    pub fn add64(&mut self, dst: Reg, src: Reg) {
        self.push(insn(ALU64 | ADD | X, dst, src, 0, 0));
    }

    /// `dst += imm` (64 bits).
    pub fn add64_imm(&mut self, dst: Reg, imm: i32) {
        self.push(insn(ALU64 | ADD | K, dst, R0, 0, imm));
    }

    /// `wdst = wsrc` (32 bits, upper half cleared).
    pub fn mov32(&mut self, dst: Reg, src: Reg) {
        self.push(insn(ALU | MOV | X, dst, src, 0, 0));
    }

    /// `wdst &= imm` (32 bits).
    pub fn and32_imm(&mut self, dst: Reg, imm: u32) {
        self.push(insn(ALU | AND | K, dst, R0, 0, i32::from_ne_bytes(imm.to_ne_bytes())));
    }

    /// `wdst <<= imm` (32 bits).
    pub fn lsh32_imm(&mut self, dst: Reg, imm: i32) {
        self.push(insn(ALU | LSH | K, dst, R0, 0, imm));
    }

    /// `dst <<= imm` (64 bits).
    pub fn lsh64_imm(&mut self, dst: Reg, imm: i32) {
        self.push(insn(ALU64 | LSH | K, dst, R0, 0, imm));
    }

    /// `dst |= src` (64 bits).
    pub fn or64(&mut self, dst: Reg, src: Reg) {
        self.push(insn(ALU64 | OR | X, dst, src, 0, 0));
    }

    /// `wdst |= wsrc` (32 bits).
    pub fn or32(&mut self, dst: Reg, src: Reg) {
        self.push(insn(ALU | OR | X, dst, src, 0, 0));
    }

    /// `wdst = *(u32 *)(src + off)`.
    pub fn ldx_w(&mut self, dst: Reg, src: Reg, off: i16) {
        self.push(insn(LDX | W | MEM, dst, src, off, 0));
    }

    /// `dst = *(u8 *)(src + off)`.
    pub fn ldx_b(&mut self, dst: Reg, src: Reg, off: i16) {
        self.push(insn(LDX | B | MEM, dst, src, off, 0));
    }

    /// `*(u64 *)(dst + off) = src`.
    pub fn stx_dw(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(insn(STX | DW | MEM, dst, src, off, 0));
    }

    /// `*(u64 *)(dst + off) = imm` (sign-extended).
    pub fn st_dw(&mut self, dst: Reg, off: i16, imm: i32) {
        self.push(insn(ST | DW | MEM, dst, R0, off, imm));
    }

    /// `lock *(u64 *)(dst + off) += src`.
    pub fn atomic_add64(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(insn(STX | DW | ATOMIC, dst, src, off, i32::from(ADD)));
    }

    /// `dst = map` (the map open as `fd`; two instruction slots).
    pub fn ld_map_fd(&mut self, dst: Reg, fd: i32) {
        self.push(insn(LD | DW | IMM, dst, Reg(PSEUDO_MAP_FD), 0, fd));
        self.push(Insn::default());
    }

    /// `if (wreg <cond> imm) goto target` (32-bit compare).
    pub fn jmp32_imm(&mut self, cond: Cond, reg: Reg, imm: u32, target: Label) {
        self.jumps.push((self.insns.len(), target));
        self.push(insn(JMP32 | cond as u8 | K, reg, R0, 0, i32::from_ne_bytes(imm.to_ne_bytes())));
    }

    /// `if (reg <cond> imm) goto target` (64-bit compare).
    pub fn jmp_imm(&mut self, cond: Cond, reg: Reg, imm: i32, target: Label) {
        self.jumps.push((self.insns.len(), target));
        self.push(insn(JMP | cond as u8 | K, reg, R0, 0, imm));
    }

    /// `goto target`.
    pub fn ja(&mut self, target: Label) {
        self.jumps.push((self.insns.len(), target));
        self.push(insn(JMP | JA, R0, R0, 0, 0));
    }

    /// Calls helper number `helper` (arguments in `r1`..`r5`, result in
    /// `r0`; `r1`..`r5` are clobbered).
    pub fn call(&mut self, helper: i32) {
        self.push(insn(JMP | CALL, R0, R0, 0, helper));
    }

    /// Returns `r0`.
    pub fn exit(&mut self) {
        self.push(insn(JMP | EXIT, R0, R0, 0, 0));
    }

    /// The program, every jump's offset resolved.
    ///
    /// # Errors
    ///
    /// [`AsmError`] for a jump to an unbound label or out of range.
    pub fn finish(mut self) -> Result<Vec<Insn>, AsmError> {
        for &(at, Label(l)) in &self.jumps {
            let target = self.labels.get(l).copied().flatten().ok_or(AsmError::Unbound(l))?;
            let rel = isize::try_from(target).unwrap_or(isize::MAX)
                - isize::try_from(at).unwrap_or(isize::MAX)
                - 1;
            let off = i16::try_from(rel).map_err(|_| AsmError::TooFar(at))?;
            if let Some(i) = self.insns.get_mut(at) {
                i.off = off;
            }
        }
        Ok(self.insns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_resolve_forward_and_backward_offsets() {
        let mut a = Asm::new();
        let fwd = a.label();
        let back = a.label();
        a.bind(back);
        a.mov64_imm(R0, 1); // 0
        a.jmp32_imm(Cond::Ne, R1, 7, fwd); // 1
        a.ja(back); // 2
        a.bind(fwd);
        a.exit(); // 3
        let p = a.finish().unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p[1].off, 1);
        assert_eq!(p[1].code, 0x56);
        assert_eq!(p[1].regs, 1);
        assert_eq!(p[1].imm, 7);
        assert_eq!(p[2].off, -3);
        assert_eq!(p[3].code, 0x95);
    }

    #[test]
    fn encodings_match_the_kernel_opcodes() {
        let mut a = Asm::new();
        a.mov64(R6, R1);
        a.ldx_w(R7, R6, 24);
        a.ld_map_fd(R1, 9);
        a.atomic_add64(R0, 0, R1);
        a.st_dw(R10, -32, 1);
        a.and32_imm(R0, 0xffff_ff00);
        let p = a.finish().unwrap();
        assert_eq!((p[0].code, p[0].regs), (0xbf, 0x16));
        assert_eq!((p[1].code, p[1].regs, p[1].off), (0x61, 0x67, 24));
        assert_eq!((p[2].code, p[2].regs, p[2].imm), (0x18, 0x11, 9));
        assert_eq!(p[3], Insn::default());
        assert_eq!((p[4].code, p[4].regs, p[4].imm), (0xdb, 0x10, 0));
        assert_eq!((p[5].code, p[5].regs, p[5].off, p[5].imm), (0x7a, 0x0a, -32, 1));
        assert_eq!((p[6].code, p[6].imm), (0x54, -256));
    }

    #[test]
    fn an_unbound_label_is_an_error() {
        let mut a = Asm::new();
        let l = a.label();
        a.ja(l);
        assert_eq!(a.finish(), Err(AsmError::Unbound(0)));
    }
}
