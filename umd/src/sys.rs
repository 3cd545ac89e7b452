//! The only place that talks to the kernel: ioctls on /dev/rblnN and
//! mappings of its memory. Every `unsafe` block of the crate outside the C
//! ABI lives here.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use nix::errno::Errno;
use rbln_uapi as uapi;

use crate::error::Op;

/// Issue ioctl `op` (one of the `RBLN_IOCTL_*` commands) with `arg`.
/// Returns the errno on failure.
pub(crate) fn ioctl<T: IoctlArg>(file: &File, arg: &mut T) -> Result<(), Errno> {
    // SAFETY: `arg` is a live, exclusively borrowed `#[repr(C)]` struct
    // whose size is exactly the size the command number encodes
    // (`IoctlArg::CMD` is built from `size_of::<T>()` in rbln-uapi); the
    // driver reads and writes at most that many bytes of it.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), T::CMD as _, arg as *mut T) };
    // EINTR (a signal handler without SA_RESTART interrupted a fence wait)
    // is reported to the caller, who decides whether to retry.
    if r < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// An ioctl argument struct and its command number.
pub(crate) trait IoctlArg {
    const CMD: u32;
    const OP: Op;
}

macro_rules! ioctl_arg {
    ($($t:ident => $cmd:ident, $op:ident;)*) => {$(
        impl IoctlArg for uapi::$t {
            const CMD: u32 = uapi::$cmd;
            const OP: Op = Op::$op;
        }
    )*};
}

ioctl_arg! {
    DeviceInfo => RBLN_IOCTL_INFO, Info;
    BoCreate => RBLN_IOCTL_BO_CREATE, BoCreate;
    BoInfo => RBLN_IOCTL_BO_INFO, BoInfo;
    BoDestroy => RBLN_IOCTL_BO_DESTROY, BoDestroy;
    VmMap => RBLN_IOCTL_VM_MAP, VmMap;
    VmUnmap => RBLN_IOCTL_VM_UNMAP, VmUnmap;
    QueueCreate => RBLN_IOCTL_QUEUE_CREATE, QueueCreate;
    QueueDestroy => RBLN_IOCTL_QUEUE_DESTROY, QueueDestroy;
    Submit => RBLN_IOCTL_SUBMIT, Submit;
    FenceWait => RBLN_IOCTL_FENCE_WAIT, FenceWait;
    DeviceStats => RBLN_IOCTL_STATS, Stats;
}

/// How a region is mapped into this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prot {
    Read,
    ReadWrite,
    /// Write only (the doorbell page).
    Write,
}

/// A shared mapping of part of /dev/rblnN (a host BO, a queue's ring,
/// status block or doorbell page), unmapped on drop.
///
/// The memory is shared with the device (and, for BOs, with every thread
/// holding the buffer), so Rust code never forms references to it. The
/// status block is copied out whole and checked for plausibility by the
/// queue; doorbells are single volatile words; tensor contents move with raw
/// `memcpy` (`copy_in`/`copy_out`), like guest-memory accessors of VMMs:
/// memory that another agent may write is never borrowed, only copied, and
/// two host threads copying into the same bytes at once get unspecified
/// bytes, as with any DMA buffer. Ordering against the device is the job of
/// the submission path (a full fence before the doorbell).
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory (or one MMIO page) owned by
// this object; it is only accessed through raw copies, atomics or volatile
// stores (see above), never borrowed, so it can be used from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// mmap `len` bytes of `file` at `offset` (an offset the driver handed
    /// out), shared.
    pub(crate) fn new(file: &File, offset: u64, len: usize, prot: Prot) -> Result<Self, Errno> {
        let prot = match prot {
            Prot::Read => libc::PROT_READ,
            Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
            Prot::Write => libc::PROT_WRITE,
        };
        let off = libc::off_t::try_from(offset).map_err(|_| Errno::EINVAL)?;
        // SAFETY: a new shared mapping chosen by the kernel (no fixed
        // address, so nothing existing is replaced); the result is checked.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), off) };
        if p == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Errno::EINVAL)?;
        Ok(Self { ptr, len })
    }

    /// Bounds check of `[off, off + len)`; the mapping is page aligned, so
    /// offsets keep their alignment as addresses.
    fn check(&self, off: usize, len: usize) {
        let end = off.checked_add(len).expect("mapping range overflows");
        assert!(end <= self.len, "mapping access {off}+{len} past its end {}", self.len);
    }

    /// Copy `src` into the mapping at `off`: one `memcpy`, the bulk path
    /// of every tensor upload (word-by-word atomic stores cost ~10× under
    /// an emulated guest CPU).
    pub(crate) fn copy_in(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: [off, off+len) is inside the live mapping (checked), and
        // `src` is process memory, so the ranges cannot overlap. Bulk
        // copies touch buffer contents that the device reads or writes only
        // while a job using them runs (ordered by fences, read with Acquire),
        // and this process never accesses the same bytes atomically during
        // the copy: word accesses are for fences and status words.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len()) };
    }

    /// Copy the mapping at `off` into `dst` (one `memcpy`, as `copy_in`).
    pub(crate) fn copy_out(&self, off: usize, dst: &mut [u8]) {
        // SAFETY: `dst` is valid for writes of its length.
        unsafe { self.copy_out_raw(off, dst.as_mut_ptr(), dst.len()) };
    }

    /// [`Mapping::copy_out`] into possibly uninitialised memory.
    ///
    /// # Safety
    /// `dst` is valid for writes of `len` bytes and overlaps no mapping.
    pub(crate) unsafe fn copy_out_raw(&self, off: usize, dst: *mut u8, len: usize) {
        self.check(off, len);
        // SAFETY: as in `copy_in`, in the other direction; `dst` per the
        // caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst, len) };
    }

    /// A 32-bit store to an MMIO page (the doorbell), after a full fence so
    /// that every earlier store (ring entry, command buffer) is visible to
    /// the device first.
    pub(crate) fn mmio_write_u32(&self, off: usize, v: u32) {
        self.check(off, 4);
        assert!(off.is_multiple_of(4), "unaligned doorbell write at {off}");
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: in bounds and aligned (checked) of a live mapping of the
        // queue's doorbell page; MMIO wants exactly one 32-bit store, which
        // a volatile write of a u32 is.
        unsafe { self.ptr.as_ptr().add(off).cast::<u32>().write_volatile(v.to_le()) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region this object mapped; no
        // reference into it outlives `self` (accessors borrow `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Round `v` up to a whole number of pages.
pub(crate) fn page_round(v: u64) -> u64 {
    v.div_ceil(rbln_hw::PAGE_SIZE) * rbln_hw::PAGE_SIZE
}
