//! The C ABI of librbln_umd (header: `umd/include/rbln_umd.h`, generated
//! from this file by cbindgen; `cargo test -p rbln-umd --release header`
//! checks it is fresh).
//!
//! Objects are opaque handles created by `rbln_*_create`/`_open`/`_alloc`
//! and released by the matching `_destroy`/`_close`/`_free` (NULL is
//! accepted there and ignored). Every function returning `rbln_status`
//! returns `RBLN_OK` on success; on failure `rbln_last_error()` gives a
//! message for this thread saying what went wrong and what to do.
//! No Rust panic crosses this boundary (it becomes `RBLN_ERR_PANIC`).
//!
//! Threads: an `rbln_device` and `rbln_buffer`s may be used from several
//! threads at once; an `rbln_queue` or `rbln_cmdbuf` by one thread at a
//! time (give each thread its own queue). Handles made from a device keep
//! it open: a device may be closed before its buffers and queues.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::{Buffer, CommandBuffer, Device, Error, Fence, Perms, Placement, Queue, SemCond, SemOp, UserQueue};

/// Status of a call. `RBLN_OK` is 0; everything else is an error, with a
/// detailed message in `rbln_last_error()`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rbln_status {
    RBLN_OK = 0,
    /// No such device node (is rbln.ko loaded?), or not an rbln NPU.
    RBLN_ERR_NO_DEVICE = 1,
    /// The device node is not accessible to this user.
    RBLN_ERR_PERMISSION = 2,
    /// An argument was rejected (by the library or the driver).
    RBLN_ERR_INVALID_ARGUMENT = 3,
    /// A handle, queue or mapping does not exist (any more).
    RBLN_ERR_NOT_FOUND = 4,
    /// A resource is in use: ring full, all hardware queues taken, VA range
    /// taken, buffer still mapped, all device contexts in use.
    RBLN_ERR_BUSY = 5,
    /// Device DRAM or device VA space exhausted.
    RBLN_ERR_NO_SPACE = 6,
    /// Host memory exhausted.
    RBLN_ERR_NO_MEMORY = 7,
    /// The queue faulted (or hung) before the fence signalled; the device
    /// context is poisoned: reopen the device.
    RBLN_ERR_FAULT = 8,
    /// The device context is poisoned by an earlier fault: reopen the device.
    RBLN_ERR_POISONED = 9,
    /// The fence did not signal in time.
    RBLN_ERR_TIMEOUT = 10,
    /// A signal interrupted the wait: retry.
    RBLN_ERR_INTERRUPTED = 11,
    /// The device was removed or its driver unbound.
    RBLN_ERR_DEVICE_GONE = 12,
    /// An offset/size lies outside a buffer.
    RBLN_ERR_OUT_OF_BOUNDS = 13,
    /// An offset or address is not aligned as the command needs.
    RBLN_ERR_MISALIGNED = 14,
    /// CPU access to a DRAM buffer (it has no CPU mapping).
    RBLN_ERR_NOT_HOST_VISIBLE = 15,
    /// The buffer is not mapped into the device VA space (or lacks the
    /// permission the command needs).
    RBLN_ERR_NOT_MAPPED = 16,
    /// The command buffer's command or descriptor area is full.
    RBLN_ERR_CMDBUF_FULL = 17,
    /// The command buffer changed while its last submission still runs.
    RBLN_ERR_CMDBUF_BUSY = 18,
    /// A required pointer argument was NULL.
    RBLN_ERR_NULL_POINTER = 19,
    /// Another operating-system error (see rbln_last_error()).
    RBLN_ERR_OS = 20,
    /// A bug in librbln_umd (a Rust panic, caught at the boundary).
    RBLN_ERR_PANIC = 21,
}

/// Where a buffer lives.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rbln_placement {
    /// Host memory: CPU-accessible (rbln_buffer_write/read), device by DMA.
    RBLN_PLACEMENT_HOST = 0,
    /// Device DRAM: device only (move data with rbln_cmdbuf_copy).
    RBLN_PLACEMENT_DRAM = 1,
}

/// How a queue is submitted to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rbln_queue_mode {
    /// Through the kernel (one ioctl per submission).
    RBLN_QUEUE_KERNEL = 0,
    /// User-mode: the library writes the mapped ring and rings the doorbell
    /// itself (no system call per submission).
    RBLN_QUEUE_USER = 1,
}

/// SEM_WAIT conditions.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rbln_sem_cond {
    RBLN_SEM_EQ = 0,
    /// Unsigned greater or equal.
    RBLN_SEM_GE = 1,
}

/// SEM_SIGNAL operations.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rbln_sem_op {
    RBLN_SEM_SET = 0,
    RBLN_SEM_ADD = 1,
}

/// Device read permission for rbln_buffer_map.
pub const RBLN_PERM_READ: u32 = 1;
/// Device write permission for rbln_buffer_map.
pub const RBLN_PERM_WRITE: u32 = 2;
/// Both.
pub const RBLN_PERM_RW: u32 = 3;

/// Version of this library's C ABI.
pub const RBLN_UMD_ABI_VERSION: u32 = 1;

/// What the device is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rbln_device_info {
    pub uapi_version: u32,
    /// major << 16 | minor << 8 | patch.
    pub driver_version: u32,
    pub vendor_id: u16,
    pub device_id: u16,
    /// major << 16 | minor.
    pub hw_version: u32,
    pub dram_size: u64,
    pub num_queues: u32,
    pub num_cores: u32,
    pub num_dma_engines: u32,
    pub caps: u32,
    /// N of /dev/rblnN.
    pub index: u32,
    pub reserved: u32,
}

/// A fence: the queue's id and the timeline value to wait for. A plain
/// value: copy it freely; wait for it with the queue it came from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rbln_fence {
    pub queue_id: u32,
    pub reserved: u32,
    pub value: u64,
}

/// An open NPU (opaque).
#[derive(Debug)]
pub struct rbln_device {
    dev: Device,
}

/// A buffer object (opaque).
#[derive(Debug)]
pub struct rbln_buffer {
    buf: Buffer,
}

#[derive(Debug)]
enum QueueKind {
    Kernel(Queue),
    User(UserQueue),
}

/// A queue, kernel-submitted or user-mode (opaque).
#[derive(Debug)]
pub struct rbln_queue {
    q: QueueKind,
}

/// A command buffer being built (opaque).
#[derive(Debug)]
pub struct rbln_cmdbuf {
    cb: CommandBuffer,
}

// ---- errors --------------------------------------------------------------

/// Why a C call failed.
enum Failure {
    Umd(Error),
    Null(&'static str),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Umd(e)
    }
}

/// The status code of a library error.
pub fn status_of(e: &Error) -> rbln_status {
    use rbln_status::*;
    match e {
        Error::NoDevice { .. } | Error::NotVisible { .. } | Error::NotAnNpu { .. } => RBLN_ERR_NO_DEVICE,
        Error::PermissionDenied { .. } => RBLN_ERR_PERMISSION,
        Error::NoContext { .. } | Error::Busy { .. } => RBLN_ERR_BUSY,
        Error::Open { .. } | Error::Os { .. } => RBLN_ERR_OS,
        Error::DeviceGone { .. } => RBLN_ERR_DEVICE_GONE,
        Error::InvalidArgument { .. } | Error::InvalidInput(_) | Error::ForeignDevice { .. } => {
            RBLN_ERR_INVALID_ARGUMENT
        }
        Error::EmptyCommandBuffer => RBLN_ERR_INVALID_ARGUMENT,
        Error::NotFound { .. } => RBLN_ERR_NOT_FOUND,
        Error::NoSpace { .. } => RBLN_ERR_NO_SPACE,
        Error::OutOfMemory { .. } => RBLN_ERR_NO_MEMORY,
        Error::Faulted { .. } => RBLN_ERR_FAULT,
        Error::Poisoned { .. } => RBLN_ERR_POISONED,
        Error::Timeout { .. } => RBLN_ERR_TIMEOUT,
        Error::Interrupted { .. } => RBLN_ERR_INTERRUPTED,
        Error::OutOfBounds { .. } => RBLN_ERR_OUT_OF_BOUNDS,
        Error::Misaligned { .. } => RBLN_ERR_MISALIGNED,
        Error::NotHostVisible => RBLN_ERR_NOT_HOST_VISIBLE,
        Error::NotMapped { .. } | Error::PermissionMissing { .. } => RBLN_ERR_NOT_MAPPED,
        Error::CommandBufferFull { .. } => RBLN_ERR_CMDBUF_FULL,
        Error::CommandBufferBusy { .. } => RBLN_ERR_CMDBUF_BUSY,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Run the body of a C entry point: errors become a status code and this
/// thread's last-error message; a panic is caught and reported.
fn ffi(f: impl FnOnce() -> Result<(), Failure>) -> rbln_status {
    let (status, msg) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return rbln_status::RBLN_OK,
        Ok(Err(Failure::Umd(e))) => (status_of(&e), e.to_string()),
        Ok(Err(Failure::Null(what))) => (rbln_status::RBLN_ERR_NULL_POINTER, format!("{what} is NULL")),
        Err(p) => {
            let m = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            (rbln_status::RBLN_ERR_PANIC, format!("internal error in librbln_umd (please report it): {m}"))
        }
    };
    // Recording the message must not unwind across the boundary either.
    let _ = catch_unwind(AssertUnwindSafe(|| set_last_error(msg)));
    status
}

/// `p` as a shared reference, or a NULL-pointer failure naming `what`.
///
/// # Safety
/// `p` is NULL or points to a live `T` not mutated during the call.
unsafe fn r<'a, T>(p: *const T, what: &'static str) -> Result<&'a T, Failure> {
    // SAFETY: the caller's contract: NULL or valid for the call.
    unsafe { p.as_ref() }.ok_or(Failure::Null(what))
}

/// `p` as an exclusive reference, or a NULL-pointer failure.
///
/// # Safety
/// `p` is NULL or points to a live `T` no one else uses during the call.
unsafe fn m<'a, T>(p: *mut T, what: &'static str) -> Result<&'a mut T, Failure> {
    // SAFETY: the caller's contract: NULL or valid and unaliased.
    unsafe { p.as_mut() }.ok_or(Failure::Null(what))
}

/// Store `v` in the out-parameter `out`.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, v: T, what: &'static str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::Null(what));
    }
    // SAFETY: non-NULL, and valid for writes by the caller's contract.
    unsafe { out.write(v) };
    Ok(())
}

/// Release a handle made by `Box::into_raw` (NULL ignored), catching a
/// panic in the destructor.
///
/// # Safety
/// `p` is NULL or a handle of type `T` from this library not yet released.
unsafe fn release<T>(p: *mut T) {
    if p.is_null() {
        return;
    }
    // SAFETY: the caller's contract: a live handle from `Box::into_raw`.
    let b = unsafe { Box::from_raw(p) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
}

// ---- errors and version ----------------------------------------------------

/// A static description of a status code (never NULL).
#[no_mangle]
pub extern "C" fn rbln_strerror(status: rbln_status) -> *const c_char {
    use rbln_status::*;
    let s: &'static CStr = match status {
        RBLN_OK => c"success",
        RBLN_ERR_NO_DEVICE => c"no rbln device: is rbln.ko loaded?",
        RBLN_ERR_PERMISSION => c"permission denied on the device node",
        RBLN_ERR_INVALID_ARGUMENT => c"invalid argument",
        RBLN_ERR_NOT_FOUND => c"no such object (destroyed, or from another device context)",
        RBLN_ERR_BUSY => c"resource busy (ring full, no free hardware queue or context, VA range in use)",
        RBLN_ERR_NO_SPACE => c"out of device memory or device address space",
        RBLN_ERR_NO_MEMORY => c"out of host memory",
        RBLN_ERR_FAULT => c"the queue faulted; the device context is poisoned: reopen the device",
        RBLN_ERR_POISONED => c"the device context is poisoned by an earlier fault: reopen the device",
        RBLN_ERR_TIMEOUT => c"timed out",
        RBLN_ERR_INTERRUPTED => c"interrupted by a signal: retry",
        RBLN_ERR_DEVICE_GONE => c"the device is gone (driver unbound or device removed)",
        RBLN_ERR_OUT_OF_BOUNDS => c"range outside the buffer",
        RBLN_ERR_MISALIGNED => c"misaligned offset or address",
        RBLN_ERR_NOT_HOST_VISIBLE => c"device DRAM buffers have no CPU mapping",
        RBLN_ERR_NOT_MAPPED => c"buffer not mapped into the device VA space (with the needed permission)",
        RBLN_ERR_CMDBUF_FULL => c"command buffer full",
        RBLN_ERR_CMDBUF_BUSY => c"command buffer still executing",
        RBLN_ERR_NULL_POINTER => c"NULL pointer argument",
        RBLN_ERR_OS => c"operating-system error",
        RBLN_ERR_PANIC => c"internal error in librbln_umd",
    };
    s.as_ptr()
}

/// The message of the last failed call on this thread ("" if none). Valid
/// until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn rbln_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// RBLN_UMD_ABI_VERSION of the library actually loaded.
#[no_mangle]
pub extern "C" fn rbln_umd_abi_version() -> u32 {
    RBLN_UMD_ABI_VERSION
}

// ---- devices -------------------------------------------------------------

/// Open /dev/rbln{index}.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_device_open(index: u32, out: *mut *mut rbln_device) -> rbln_status {
    ffi(|| {
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        let dev = Device::open(index)?;
        // SAFETY: checked non-NULL; valid by the caller's contract.
        unsafe { put(out, Box::into_raw(Box::new(rbln_device { dev })), "out") }
    })
}

/// Open an rbln device node by path.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_device_open_path(path: *const c_char, out: *mut *mut rbln_device) -> rbln_status {
    ffi(|| {
        if path.is_null() {
            return Err(Failure::Null("path"));
        }
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        // SAFETY: non-NULL and NUL-terminated by the caller's contract.
        let p = unsafe { CStr::from_ptr(path) };
        let p = p.to_str().map_err(|_| Error::InvalidInput("the path is not UTF-8".into()))?;
        let dev = Device::open_path(p)?;
        // SAFETY: checked non-NULL; valid by the caller's contract.
        unsafe { put(out, Box::into_raw(Box::new(rbln_device { dev })), "out") }
    })
}

/// Release a device handle (NULL is ignored). Buffers, queues and command
/// buffers made from it stay usable.
///
/// # Safety
/// `dev` is NULL or a handle not yet closed, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn rbln_device_close(dev: *mut rbln_device) {
    // SAFETY: the caller's contract.
    unsafe { release(dev) }
}

/// What the device is.
///
/// # Safety
/// `dev` is a live handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_device_get_info(dev: *const rbln_device, out: *mut rbln_device_info) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let d = unsafe { r(dev, "dev") }?;
        let i = d.dev.info();
        let info = rbln_device_info {
            uapi_version: i.uapi_version,
            driver_version: i.driver_version.0 << 16 | i.driver_version.1 << 8 | i.driver_version.2,
            vendor_id: i.vendor_id,
            device_id: i.device_id,
            hw_version: i.hw_version.0 << 16 | i.hw_version.1,
            dram_size: i.dram_size,
            num_queues: i.num_queues,
            num_cores: i.num_cores,
            num_dma_engines: i.num_dma_engines,
            caps: i.caps,
            index: i.index,
            reserved: 0,
        };
        // SAFETY: the caller's contract.
        unsafe { put(out, info, "out") }
    })
}

// ---- buffers ---------------------------------------------------------------

/// Allocate a buffer of `size` bytes (1 ..= 1 GiB) in host memory or device
/// DRAM. Map it into the device VA space with rbln_buffer_map before
/// commands use it.
///
/// # Safety
/// `dev` is a live handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_buffer_alloc(
    dev: *const rbln_device,
    size: u64,
    placement: rbln_placement,
    out: *mut *mut rbln_buffer,
) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let d = unsafe { r(dev, "dev") }?;
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        let p = match placement {
            rbln_placement::RBLN_PLACEMENT_HOST => Placement::Host,
            rbln_placement::RBLN_PLACEMENT_DRAM => Placement::Dram,
        };
        let buf = d.dev.alloc(size, p)?;
        // SAFETY: checked non-NULL; valid by the caller's contract.
        unsafe { put(out, Box::into_raw(Box::new(rbln_buffer { buf })), "out") }
    })
}

/// Free a buffer: its device mappings go with it (NULL is ignored). Work
/// still using it then faults: wait for its fences first.
///
/// # Safety
/// `buf` is NULL or a live handle used by no other thread during the call.
#[no_mangle]
pub unsafe extern "C" fn rbln_buffer_free(buf: *mut rbln_buffer) {
    // SAFETY: the caller's contract.
    unsafe { release(buf) }
}

/// Map the whole buffer into the device VA space with `perms`
/// (RBLN_PERM_READ | RBLN_PERM_WRITE); the VA is stored in `*va_out` (which
/// may be NULL).
///
/// # Safety
/// `buf` is a live handle; `va_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_buffer_map(buf: *const rbln_buffer, perms: u32, va_out: *mut u64) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { r(buf, "buf") }?;
        let p = Perms::from_bits(perms).ok_or_else(|| {
            Error::InvalidInput(format!("permissions {perms:#x}: use RBLN_PERM_READ and/or RBLN_PERM_WRITE"))
        })?;
        let va = b.buf.map(p)?;
        if !va_out.is_null() {
            // SAFETY: non-NULL, valid by the caller's contract.
            unsafe { va_out.write(va) };
        }
        Ok(())
    })
}

/// Remove the mapping of `buf` that starts at device VA `va`.
///
/// # Safety
/// `buf` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn rbln_buffer_unmap(buf: *const rbln_buffer, va: u64) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { r(buf, "buf") }?;
        b.buf.unmap(va)?;
        Ok(())
    })
}

/// Size in bytes as allocated (0 for NULL).
///
/// # Safety
/// `buf` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn rbln_buffer_size(buf: *const rbln_buffer) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { buf.as_ref() }.map_or(0, |b| b.buf.size())
}

/// Device VA of the buffer's first mapping.
///
/// # Safety
/// `buf` is a live handle; `va_out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_buffer_device_va(buf: *const rbln_buffer, va_out: *mut u64) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { r(buf, "buf") }?;
        let va = b.buf.device_va()?;
        // SAFETY: the caller's contract.
        unsafe { put(va_out, va, "va_out") }
    })
}

/// Copy `len` bytes from `src` into a host buffer at `offset`.
///
/// # Safety
/// `buf` is a live handle; `src` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rbln_buffer_write(buf: *const rbln_buffer, offset: u64, src: *const c_void, len: usize) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { r(buf, "buf") }?;
        if len == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(Failure::Null("src"));
        }
        // SAFETY: non-NULL and valid for `len` bytes by the caller's contract.
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
        b.buf.write_slice(offset, data)?;
        Ok(())
    })
}

/// Copy `len` bytes out of a host buffer at `offset` into `dst`.
///
/// # Safety
/// `buf` is a live handle; `dst` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rbln_buffer_read(buf: *const rbln_buffer, offset: u64, dst: *mut c_void, len: usize) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { r(buf, "buf") }?;
        if len == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(Failure::Null("dst"));
        }
        // SAFETY: non-NULL and valid for `len` bytes of writes by the
        // caller's contract; no Rust reference aliases it.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        b.buf.read_slice(offset, out)?;
        Ok(())
    })
}

// ---- queues and fences -----------------------------------------------------

/// Create a queue of `entries` ring entries (power of two, 4..=128; 0 for
/// the default, 128) submitted to in `mode`.
///
/// # Safety
/// `dev` is a live handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_queue_create(
    dev: *const rbln_device,
    entries: u32,
    mode: rbln_queue_mode,
    out: *mut *mut rbln_queue,
) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let d = unsafe { r(dev, "dev") }?;
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        let q = d.dev.create_queue(entries)?;
        let q = match mode {
            rbln_queue_mode::RBLN_QUEUE_KERNEL => QueueKind::Kernel(q),
            rbln_queue_mode::RBLN_QUEUE_USER => QueueKind::User(q.into_user_mode()?),
        };
        // SAFETY: checked non-NULL; valid by the caller's contract.
        unsafe { put(out, Box::into_raw(Box::new(rbln_queue { q })), "out") }
    })
}

/// Destroy a queue (NULL is ignored); its pending work is abandoned.
///
/// # Safety
/// `q` is NULL or a live handle used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn rbln_queue_destroy(q: *mut rbln_queue) {
    // SAFETY: the caller's contract.
    unsafe { release(q) }
}

/// The queue's id (0 for NULL).
///
/// # Safety
/// `q` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn rbln_queue_id(q: *const rbln_queue) -> u32 {
    // SAFETY: the caller's contract.
    match unsafe { q.as_ref() } {
        Some(rbln_queue { q: QueueKind::Kernel(k) }) => k.id(),
        Some(rbln_queue { q: QueueKind::User(u) }) => u.id(),
        None => 0,
    }
}

/// User-mode queues: whether fences raise the fence interrupt (default
/// true). false gives the lowest latency with rbln_fence_spin_wait;
/// rbln_fence_wait then polls instead of sleeping in the kernel. Applies to
/// later submissions. Kernel queues always use interrupts:
/// RBLN_ERR_INVALID_ARGUMENT if `on` is false for one.
///
/// # Safety
/// `q` is a live handle used by no other thread during the call.
#[no_mangle]
pub unsafe extern "C" fn rbln_queue_set_fence_interrupts(q: *mut rbln_queue, on: bool) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { m(q, "queue") }?;
        match &mut q.q {
            QueueKind::User(u) => u.set_fence_interrupts(on),
            QueueKind::Kernel(_) if on => {}
            QueueKind::Kernel(_) => {
                return Err(Error::InvalidInput("kernel-submitted queues always raise fence interrupts".into()).into())
            }
        }
        Ok(())
    })
}

/// Submit a command buffer; `*fence_out` (may be NULL) signals when it
/// completed. Uploads the command buffer's bytes if they changed.
///
/// # Safety
/// `q` and `cb` are live handles used by no other thread during the call;
/// `fence_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_queue_submit(q: *mut rbln_queue, cb: *mut rbln_cmdbuf, fence_out: *mut rbln_fence) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { m(q, "queue") }?;
        // SAFETY: the caller's contract.
        let cb = unsafe { m(cb, "cmdbuf") }?;
        let f = match &mut q.q {
            QueueKind::Kernel(k) => k.submit_ioctl(&mut cb.cb)?,
            QueueKind::User(u) => u.submit(&mut cb.cb)?,
        };
        if !fence_out.is_null() {
            // SAFETY: non-NULL, valid by the caller's contract.
            unsafe { fence_out.write(rbln_fence { queue_id: f.queue_id(), reserved: 0, value: f.value() }) };
        }
        Ok(())
    })
}

fn fence_of(q: &rbln_queue, f: rbln_fence) -> Result<Fence, Failure> {
    let shared = match &q.q {
        QueueKind::Kernel(k) => k.shared(),
        QueueKind::User(u) => u.shared(),
    };
    if f.queue_id != shared.id {
        return Err(Error::InvalidInput(format!(
            "the fence belongs to queue {}, not to queue {}: wait with the queue that returned it",
            f.queue_id, shared.id
        ))
        .into());
    }
    let irq = match &q.q {
        QueueKind::Kernel(_) => true,
        QueueKind::User(u) => u.fence_interrupts(),
    };
    Ok(Fence::from_parts(shared.clone(), f.value, irq))
}

/// Sleep until `fence` signals, at most `timeout_ns` nanoseconds (0 polls).
/// RBLN_ERR_TIMEOUT if it did not, RBLN_ERR_FAULT if the queue faulted
/// first, RBLN_ERR_INTERRUPTED on a signal.
///
/// # Safety
/// `q` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn rbln_fence_wait(q: *const rbln_queue, fence: rbln_fence, timeout_ns: u64) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { r(q, "queue") }?;
        fence_of(q, fence)?.wait(Duration::from_nanos(timeout_ns))?;
        Ok(())
    })
}

/// Like rbln_fence_wait but busy-polls the queue's status block (lowest
/// latency; keeps a CPU busy).
///
/// # Safety
/// `q` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn rbln_fence_spin_wait(q: *const rbln_queue, fence: rbln_fence, timeout_ns: u64) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { r(q, "queue") }?;
        fence_of(q, fence)?.spin_wait(Duration::from_nanos(timeout_ns))?;
        Ok(())
    })
}

/// Whether `fence` has signalled, without blocking.
///
/// # Safety
/// `q` is a live handle; `signalled` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_fence_poll(q: *const rbln_queue, fence: rbln_fence, signalled: *mut bool) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { r(q, "queue") }?;
        let done = fence_of(q, fence)?.poll()?;
        // SAFETY: the caller's contract.
        unsafe { put(signalled, done, "signalled") }
    })
}

// ---- command buffers -------------------------------------------------------

/// Create a command buffer with the default room (32 KiB of commands, 32
/// KiB of compute descriptors).
///
/// # Safety
/// `dev` is a live handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_create(dev: *const rbln_device, out: *mut *mut rbln_cmdbuf) -> rbln_status {
    // SAFETY: the caller's contract, passed on.
    unsafe { rbln_cmdbuf_create_with_capacity(dev, crate::DEFAULT_COMMAND_BYTES, crate::DEFAULT_DESCRIPTOR_BYTES, out) }
}

/// Create a command buffer with room for `command_bytes` of commands and
/// `descriptor_bytes` of compute descriptors.
///
/// # Safety
/// `dev` is a live handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_create_with_capacity(
    dev: *const rbln_device,
    command_bytes: u64,
    descriptor_bytes: u64,
    out: *mut *mut rbln_cmdbuf,
) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let d = unsafe { r(dev, "dev") }?;
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        let cb = CommandBuffer::with_capacity(&d.dev, command_bytes, descriptor_bytes)?;
        // SAFETY: checked non-NULL; valid by the caller's contract.
        unsafe { put(out, Box::into_raw(Box::new(rbln_cmdbuf { cb })), "out") }
    })
}

/// Destroy a command buffer (NULL is ignored); waits (up to 10 s) for its
/// last submission to finish.
///
/// # Safety
/// `cb` is NULL or a live handle used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_destroy(cb: *mut rbln_cmdbuf) {
    // SAFETY: the caller's contract.
    unsafe { release(cb) }
}

/// Run `f` on the command buffer behind `cb`.
///
/// # Safety
/// `cb` is NULL or a live handle used by no other thread during the call.
unsafe fn with_cb(cb: *mut rbln_cmdbuf, f: impl FnOnce(&mut CommandBuffer) -> Result<(), Error>) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let cb = unsafe { m(cb, "cmdbuf") }?;
        f(&mut cb.cb)?;
        Ok(())
    })
}

/// Remove every command.
///
/// # Safety
/// `cb` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_reset(cb: *mut rbln_cmdbuf) -> rbln_status {
    // SAFETY: the caller's contract.
    unsafe {
        with_cb(cb, |c| {
            c.reset();
            Ok(())
        })
    }
}

/// Number of command bytes encoded (0 for NULL).
///
/// # Safety
/// `cb` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_size(cb: *const rbln_cmdbuf) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { cb.as_ref() }.map_or(0, |c| c.cb.len() as u64)
}

/// Append a NOP.
///
/// # Safety
/// `cb` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_nop(cb: *mut rbln_cmdbuf) -> rbln_status {
    // SAFETY: the caller's contract.
    unsafe {
        with_cb(cb, |c| {
            c.nop();
            Ok(())
        })
    }
}

/// Append a DMA copy of `size` bytes from `src` at `src_offset` to `dst` at
/// `dst_offset` (both mapped; src readable, dst writable).
///
/// # Safety
/// `cb`, `src` and `dst` are live handles.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_copy(
    cb: *mut rbln_cmdbuf,
    src: *const rbln_buffer,
    src_offset: u64,
    dst: *const rbln_buffer,
    dst_offset: u64,
    size: u64,
) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let (s, d) = unsafe { (r(src, "src")?, r(dst, "dst")?) };
        // SAFETY: the caller's contract.
        let c = unsafe { m(cb, "cmdbuf") }?;
        c.cb.copy(&s.buf, src_offset, &d.buf, dst_offset, size)?;
        Ok(())
    })
}

/// Append a fill of `size` bytes of `dst` at `offset` with `value` (offset
/// and size multiples of 4).
///
/// # Safety
/// `cb` and `dst` are live handles.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_fill(cb: *mut rbln_cmdbuf, dst: *const rbln_buffer, offset: u64, size: u64, value: u32) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let d = unsafe { r(dst, "dst") }?;
        // SAFETY: the caller's contract.
        let c = unsafe { m(cb, "cmdbuf") }?;
        c.cb.fill(&d.buf, offset, size, value)?;
        Ok(())
    })
}

/// Append a timestamp: the device clock (u64 nanoseconds) is written to
/// `buf` at `offset` (a multiple of 8) once all earlier commands completed.
///
/// # Safety
/// `cb` and `buf` are live handles.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_timestamp(cb: *mut rbln_cmdbuf, buf: *const rbln_buffer, offset: u64) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { r(buf, "buf") }?;
        // SAFETY: the caller's contract.
        let c = unsafe { m(cb, "cmdbuf") }?;
        c.cb.timestamp(&b.buf, offset)?;
        Ok(())
    })
}

/// Append a semaphore wait: the queue blocks until the u64 in `buf` at
/// `offset` satisfies `cond` against `value`.
///
/// # Safety
/// `cb` and `buf` are live handles.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_sem_wait(
    cb: *mut rbln_cmdbuf,
    buf: *const rbln_buffer,
    offset: u64,
    value: u64,
    cond: rbln_sem_cond,
) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { r(buf, "buf") }?;
        // SAFETY: the caller's contract.
        let c = unsafe { m(cb, "cmdbuf") }?;
        let cond = match cond {
            rbln_sem_cond::RBLN_SEM_EQ => SemCond::Eq,
            rbln_sem_cond::RBLN_SEM_GE => SemCond::Ge,
        };
        c.cb.sem_wait(&b.buf, offset, value, cond)?;
        Ok(())
    })
}

/// Append a semaphore signal on the u64 in `buf` at `offset`.
///
/// # Safety
/// `cb` and `buf` are live handles.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_sem_signal(
    cb: *mut rbln_cmdbuf,
    buf: *const rbln_buffer,
    offset: u64,
    value: u64,
    op: rbln_sem_op,
) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { r(buf, "buf") }?;
        // SAFETY: the caller's contract.
        let c = unsafe { m(cb, "cmdbuf") }?;
        let op = match op {
            rbln_sem_op::RBLN_SEM_SET => SemOp::Set,
            rbln_sem_op::RBLN_SEM_ADD => SemOp::Add,
        };
        c.cb.sem_signal(&b.buf, offset, value, op)?;
        Ok(())
    })
}

/// Append a GEMM `C = A * B` in fp32: A is m×k, B k×n, C m×n, row-major
/// and densely packed at the given byte offsets (multiples of 4) of mapped
/// buffers (A and B readable, C writable; device DRAM is fastest).
///
/// # Safety
/// `cb`, `a`, `b` and `c` are live handles.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_gemm(
    cb: *mut rbln_cmdbuf,
    m_rows: u32,
    n_cols: u32,
    k_inner: u32,
    a: *const rbln_buffer,
    a_offset: u64,
    b: *const rbln_buffer,
    b_offset: u64,
    c: *const rbln_buffer,
    c_offset: u64,
) -> rbln_status {
    ffi(|| {
        // SAFETY: the caller's contract.
        let (ab, bb, cbuf) = unsafe { (r(a, "a")?, r(b, "b")?, r(c, "c")?) };
        // SAFETY: the caller's contract.
        let cmd = unsafe { m(cb, "cmdbuf") }?;
        cmd.cb.gemm(m_rows, n_cols, k_inner, (&ab.buf, a_offset), (&bb.buf, b_offset), (&cbuf.buf, c_offset))?;
        Ok(())
    })
}

/// Append a compute command for a descriptor given as bytes (any op of
/// docs/hardware.md section 8, header included; the VAs inside it are
/// device VAs of mapped buffers). The bytes are copied.
///
/// # Safety
/// `cb` is a live handle; `desc` is valid for reads of `desc_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_compute(cb: *mut rbln_cmdbuf, desc: *const c_void, desc_size: usize) -> rbln_status {
    ffi(|| {
        if desc.is_null() {
            return Err(Failure::Null("desc"));
        }
        // SAFETY: non-NULL and valid for `desc_size` bytes by the caller's
        // contract.
        let bytes = unsafe { std::slice::from_raw_parts(desc.cast::<u8>(), desc_size) };
        // SAFETY: the caller's contract.
        let c = unsafe { m(cb, "cmdbuf") }?;
        c.cb.compute_bytes(bytes)?;
        Ok(())
    })
}

/// Append a call (INDIRECT) of `other`, whose current contents are uploaded
/// now; `other` must not change while `cb` may still run.
///
/// # Safety
/// `cb` and `other` are distinct live handles.
#[no_mangle]
pub unsafe extern "C" fn rbln_cmdbuf_call(cb: *mut rbln_cmdbuf, other: *mut rbln_cmdbuf) -> rbln_status {
    ffi(|| {
        if cb == other {
            return Err(Error::InvalidInput("a command buffer cannot call itself".into()).into());
        }
        // SAFETY: the caller's contract; distinct (checked), so not aliased.
        let (c, o) = unsafe { (m(cb, "cmdbuf")?, m(other, "other")?) };
        c.cb.call(&mut o.cb)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: the library's own NUL-terminated string.
        unsafe { CStr::from_ptr(rbln_last_error()) }.to_str().unwrap().to_owned()
    }

    #[test]
    fn null_pointers_are_errors_not_crashes() {
        // SAFETY: deliberately NULL arguments; each must be rejected.
        unsafe {
            assert_eq!(rbln_device_open(0, std::ptr::null_mut()), rbln_status::RBLN_ERR_NULL_POINTER);
            assert_eq!(last_error(), "out is NULL");
            let mut info = rbln_device_info::default();
            assert_eq!(rbln_device_get_info(std::ptr::null(), &mut info), rbln_status::RBLN_ERR_NULL_POINTER);
            assert_eq!(last_error(), "dev is NULL");
            assert_eq!(
                rbln_queue_submit(std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()),
                rbln_status::RBLN_ERR_NULL_POINTER
            );
            assert_eq!(rbln_cmdbuf_nop(std::ptr::null_mut()), rbln_status::RBLN_ERR_NULL_POINTER);
            assert_eq!(rbln_buffer_size(std::ptr::null()), 0);
            rbln_device_close(std::ptr::null_mut());
            rbln_buffer_free(std::ptr::null_mut());
            rbln_queue_destroy(std::ptr::null_mut());
            rbln_cmdbuf_destroy(std::ptr::null_mut());
        }
    }

    #[test]
    fn open_errors_carry_a_message() {
        let mut dev = std::ptr::null_mut();
        // SAFETY: valid out-pointer and a NUL-terminated path.
        let st = unsafe { rbln_device_open_path(c"/nonexistent/rbln7".as_ptr(), &mut dev) };
        assert_eq!(st, rbln_status::RBLN_ERR_NO_DEVICE);
        assert!(dev.is_null());
        let msg = last_error();
        assert!(msg.contains("is rbln.ko loaded?"), "{msg}");
        // SAFETY: a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(rbln_strerror(st)) }.to_str().unwrap();
        assert!(s.contains("rbln.ko"), "{s}");
    }

    #[test]
    fn panics_do_not_cross_the_boundary() {
        let st = ffi(|| panic!("boom"));
        assert_eq!(st, rbln_status::RBLN_ERR_PANIC);
        assert!(last_error().contains("boom"), "{}", last_error());
    }

    #[test]
    fn statuses_follow_the_errors() {
        use crate::Op;
        use nix::errno::Errno;
        let st = |op, e| status_of(&Error::from_errno(op, e));
        assert_eq!(st(Op::BoCreate, Errno::ENOSPC), rbln_status::RBLN_ERR_NO_SPACE);
        assert_eq!(st(Op::Submit, Errno::EBUSY), rbln_status::RBLN_ERR_BUSY);
        assert_eq!(st(Op::Submit, Errno::EIO), rbln_status::RBLN_ERR_POISONED);
        assert_eq!(st(Op::VmUnmap, Errno::ENOENT), rbln_status::RBLN_ERR_NOT_FOUND);
        assert_eq!(st(Op::FenceWait, Errno::EINTR), rbln_status::RBLN_ERR_INTERRUPTED);
        assert_eq!(st(Op::QueueCreate, Errno::ENODEV), rbln_status::RBLN_ERR_DEVICE_GONE);
        assert_eq!(st(Op::BoCreate, Errno::EINVAL), rbln_status::RBLN_ERR_INVALID_ARGUMENT);
        assert_eq!(st(Op::Info, Errno::EFAULT), rbln_status::RBLN_ERR_OS);
        let f = Error::Faulted { queue: 3, fault: None };
        assert_eq!(status_of(&f), rbln_status::RBLN_ERR_FAULT);
        let t = Error::Timeout { queue: 1, value: 2, timeout: Duration::from_millis(5) };
        assert_eq!(status_of(&t), rbln_status::RBLN_ERR_TIMEOUT);
    }
}
