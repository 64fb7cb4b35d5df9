//! The `bpf(2)` commands the egress rules need: loading a program, making,
//! reading and clearing its maps, and attaching it to a cgroup through a link (the
//! program stays attached exactly as long as the link's descriptor is open,
//! so a reused cgroup leaf is left clean when the link is dropped).
//!
//! Layouts follow `union bpf_attr` of `<linux/bpf.h>`; each command's
//! struct holds its leading fields only, and the kernel reads the missing
//! tail as zero.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_int = 4;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;

/// `BPF_OBJ_NAME_LEN`: object names hold 15 bytes and a NUL.
const OBJ_NAME_LEN: usize = 16;

/// One eBPF instruction (`struct bpf_insn`): `regs` holds the destination
/// register in its low nibble and the source in its high one.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Insn {
    /// Opcode: class, size or operation, source.
    pub code: u8,
    /// `dst_reg | src_reg << 4`.
    pub regs: u8,
    /// Signed offset (memory access, jump).
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; OBJ_NAME_LEN],
}

#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    key: u64,
    value_or_next_key: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; OBJ_NAME_LEN],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
}

/// A BPF map and the key and value sizes it was made with (lookups check
/// their buffers against them, so the kernel never writes past one).
#[derive(Debug)]
pub struct Map {
    fd: OwnedFd,
    key_size: usize,
    value_size: usize,
}

impl Map {
    /// The map's descriptor (for a program's `BPF_PSEUDO_MAP_FD` load).
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

fn name_bytes(name: &str) -> [u8; OBJ_NAME_LEN] {
    let mut out = [0u8; OBJ_NAME_LEN];
    for (o, b) in out.iter_mut().zip(name.bytes().take(OBJ_NAME_LEN - 1)) {
        *o = b;
    }
    out
}

fn fd_result(r: libc::c_long) -> io::Result<OwnedFd> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn u32_of(n: usize) -> io::Result<u32> {
    u32::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))
}

/// `BPF_MAP_CREATE`: a map of `map_type` (`BPF_MAP_TYPE_*`).
///
/// # Errors
///
/// The errno of `bpf(BPF_MAP_CREATE)` (`EPERM` without `CAP_BPF`).
pub fn map_create(
    map_type: u32,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
    name: &str,
) -> io::Result<Map> {
    let attr = MapCreateAttr {
        map_type,
        key_size: u32_of(key_size)?,
        value_size: u32_of(value_size)?,
        max_entries,
        map_flags: 0,
        inner_map_fd: 0,
        numa_node: 0,
        map_name: name_bytes(name),
    };
    // SAFETY: attr is a valid, initialised struct of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &raw const attr,
            std::mem::size_of::<MapCreateAttr>(),
        )
    };
    Ok(Map { fd: fd_result(r)?, key_size, value_size })
}

fn elem_call(cmd: libc::c_int, attr: &ElemAttr) -> io::Result<bool> {
    // SAFETY: attr is a valid struct of the size passed; its pointers were
    // checked by the callers against the map's key and value sizes.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_ref(attr), std::mem::size_of::<ElemAttr>())
    };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOENT) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// `BPF_MAP_LOOKUP_ELEM`: the value of `key` into `value`; false when the
/// map holds no such key.
///
/// # Errors
///
/// `EINVAL` when a buffer's length is not the map's size; the errno of
/// `bpf(BPF_MAP_LOOKUP_ELEM)`.
pub fn map_lookup(map: &Map, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    if key.len() != map.key_size || value.len() != map.value_size {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let attr = ElemAttr {
        map_fd: u32_of(usize::try_from(map.fd.as_raw_fd()).unwrap_or(0))?,
        key: key.as_ptr() as u64,
        value_or_next_key: value.as_mut_ptr() as u64,
        flags: 0,
    };
    elem_call(BPF_MAP_LOOKUP_ELEM, &attr)
}

/// `BPF_MAP_DELETE_ELEM`: removes `key`; false when the map held no such
/// key.
///
/// # Errors
///
/// `EINVAL` when the key's length is not the map's key size; the errno of
/// `bpf(BPF_MAP_DELETE_ELEM)`.
pub fn map_delete(map: &Map, key: &[u8]) -> io::Result<bool> {
    if key.len() != map.key_size {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let attr = ElemAttr {
        map_fd: u32_of(usize::try_from(map.fd.as_raw_fd()).unwrap_or(0))?,
        key: key.as_ptr() as u64,
        value_or_next_key: 0,
        flags: 0,
    };
    elem_call(BPF_MAP_DELETE_ELEM, &attr)
}

/// `BPF_MAP_GET_NEXT_KEY`: the key after `key` (the first key for `None`)
/// into `next`; false past the last key.
///
/// # Errors
///
/// `EINVAL` when a buffer's length is not the map's key size; the errno
/// of `bpf(BPF_MAP_GET_NEXT_KEY)`.
pub fn map_next_key(map: &Map, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    if key.is_some_and(|k| k.len() != map.key_size) || next.len() != map.key_size {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let attr = ElemAttr {
        map_fd: u32_of(usize::try_from(map.fd.as_raw_fd()).unwrap_or(0))?,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value_or_next_key: next.as_mut_ptr() as u64,
        flags: 0,
    };
    elem_call(BPF_MAP_GET_NEXT_KEY, &attr)
}

/// `BPF_PROG_LOAD`: a GPL program of `prog_type` for `expected_attach_type`.
/// With `log`, the verifier writes its log there (level 1), NUL-terminated.
///
/// # Errors
///
/// The errno of `bpf(BPF_PROG_LOAD)` (`EACCES` or `EINVAL`: the verifier
/// refused the program, its reason in `log`).
pub fn prog_load(
    prog_type: u32,
    expected_attach_type: u32,
    insns: &[Insn],
    name: &str,
    log: Option<&mut [u8]>,
) -> io::Result<OwnedFd> {
    const LICENSE: &[u8] = b"GPL\0";
    let (log_level, log_size, log_buf) = match log {
        Some(buf) => (1, u32_of(buf.len())?, buf.as_mut_ptr() as u64),
        None => (0, 0, 0),
    };
    let attr = ProgLoadAttr {
        prog_type,
        insn_cnt: u32_of(insns.len())?,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        log_level,
        log_size,
        log_buf,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name_bytes(name),
        prog_ifindex: 0,
        expected_attach_type,
    };
    // SAFETY: attr is a valid struct of the size passed; insns, the
    // license and the log buffer outlive the call, of the lengths given.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &raw const attr,
            std::mem::size_of::<ProgLoadAttr>(),
        )
    };
    fd_result(r)
}

/// `BPF_LINK_CREATE`: attaches `prog` to the cgroup v2 directory open as
/// `cgroup` at `attach_type` (several programs may share a hook; each
/// must allow). Closing the returned link detaches the program.
///
/// # Errors
///
/// The errno of `bpf(BPF_LINK_CREATE)` (`EBADF`/`EINVAL` for a cgroup v1
/// directory).
pub fn link_create_cgroup(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let attr = LinkCreateAttr {
        prog_fd: u32_of(usize::try_from(prog.as_raw_fd()).unwrap_or(0))?,
        target_fd: u32_of(usize::try_from(cgroup.as_raw_fd()).unwrap_or(0))?,
        attach_type,
        flags: 0,
    };
    // SAFETY: attr is a valid struct of the size passed; both fds are open.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            &raw const attr,
            std::mem::size_of::<LinkCreateAttr>(),
        )
    };
    fd_result(r)
}
