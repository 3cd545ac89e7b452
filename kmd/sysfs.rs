// SPDX-License-Identifier: GPL-2.0

//! Stable per-device attributes in sysfs, on the misc device:
//! `/sys/class/misc/rblnN/<name>` (names: `uapi::sysfs`). One value per
//! file, plain text, for monitoring agents that should not need an ioctl
//! (the Kubernetes device plugin follows `health`). `reset` is the
//! privileged reset: root writes `1`.
//!
//! The kernel has no Rust abstraction for device attributes yet, so they
//! are `struct device_attribute`s in static memory, created on the misc
//! device after it is registered and removed with it (misc_deregister
//! waits for running callbacks, see `MiscHolder`).

use core::cell::UnsafeCell;
use core::fmt::Write;

use kernel::{bindings, miscdevice::MiscDeviceRegistration, prelude::*};

use crate::file::RblnFile;
use crate::npu::{MiscHolder, Npu};
use crate::uapi::{self, sysfs};

/// What a read of one attribute shows.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Show {
    HwVersion,
    DriverVersion,
    DramTotal,
    DramUsed,
    Utilization,
    Health,
    ResetCount,
    Faults,
    PciAddress,
}

/// A `struct device_attribute` the kernel may point at: static, writable
/// memory (lockdep wants keys in static storage).
#[repr(transparent)]
struct Attr(UnsafeCell<bindings::device_attribute>);

// SAFETY: the attribute is written only by `const` initialisation; the
// kernel reads it (sysfs keeps a pointer) and never writes it for static
// attributes.
unsafe impl Sync for Attr {}

const fn attr(name: &'static CStr, mode: u16, show: Option<ShowFn>, store: Option<StoreFn>) -> Attr {
    // SAFETY: all-zero is a valid `device_attribute` (null pointers, no
    // callbacks, a zeroed lockdep key for static storage).
    let mut a: bindings::device_attribute = unsafe { core::mem::zeroed() };
    a.attr.name = kernel::str::as_char_ptr_in_const_context(name);
    a.attr.mode = mode;
    a.__bindgen_anon_1.show = show;
    a.__bindgen_anon_2.store = store;
    Attr(UnsafeCell::new(a))
}

type ShowFn = unsafe extern "C" fn(*mut bindings::device, *mut bindings::device_attribute, *mut kernel::ffi::c_char) -> isize;
type StoreFn =
    unsafe extern "C" fn(*mut bindings::device, *mut bindings::device_attribute, *const kernel::ffi::c_char, usize) -> isize;

static ATTRS: [Attr; 10] = [
    attr(sysfs::HW_VERSION, 0o444, Some(show::<{ Show::HwVersion as u8 }>), None),
    attr(sysfs::DRIVER_VERSION, 0o444, Some(show::<{ Show::DriverVersion as u8 }>), None),
    attr(sysfs::DRAM_TOTAL_BYTES, 0o444, Some(show::<{ Show::DramTotal as u8 }>), None),
    attr(sysfs::DRAM_USED_BYTES, 0o444, Some(show::<{ Show::DramUsed as u8 }>), None),
    attr(sysfs::UTILIZATION, 0o444, Some(show::<{ Show::Utilization as u8 }>), None),
    attr(sysfs::HEALTH, 0o444, Some(show::<{ Show::Health as u8 }>), None),
    attr(sysfs::RESET_COUNT, 0o444, Some(show::<{ Show::ResetCount as u8 }>), None),
    attr(sysfs::FAULTS, 0o444, Some(show::<{ Show::Faults as u8 }>), None),
    attr(sysfs::PCI_ADDRESS, 0o444, Some(show::<{ Show::PciAddress as u8 }>), None),
    attr(sysfs::RESET, 0o200, None, Some(store_reset)),
];

/// Create the attributes on `misc`'s device. A failure is logged and the
/// device works without them.
pub(crate) fn create(misc: &MiscDeviceRegistration<RblnFile>, npu: &Npu) {
    // SAFETY: `misc` is registered, so `this_device` is a live device.
    let dev = unsafe { (*misc.as_raw()).this_device };
    for a in &ATTRS {
        // SAFETY: `dev` is live (above); `a` is static and lives as long as
        // the module, longer than the device (removed at misc_deregister).
        let r = unsafe { bindings::device_create_file(dev, a.0.get()) };
        if r != 0 {
            dev_warn!(npu.pdev, "rbln{}: cannot create a sysfs attribute ({}); continuing without it\n", npu.index, r);
        }
    }
}

/// The Npu behind a misc device's `struct device`.
///
/// # Safety
///
/// `dev` is the `this_device` of a registered `MiscHolder`'s registration,
/// during a sysfs callback (the registration outlives the callback).
unsafe fn npu_of<'a>(dev: *mut bindings::device) -> &'a Npu {
    // SAFETY: misc_register stores the `struct miscdevice` as the device's
    // driver data; ours is the `reg` field (a transparent wrapper of it) of
    // a pinned MiscHolder, alive during the callback (caller's contract).
    unsafe {
        let misc = bindings::dev_get_drvdata(dev).cast::<MiscDeviceRegistration<RblnFile>>();
        &(*kernel::container_of!(misc, MiscHolder, reg)).npu
    }
}

/// Writes into sysfs's page-sized buffer.
struct Page {
    buf: *mut u8,
    len: usize,
}

impl Write for Page {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let cap = kernel::page::PAGE_SIZE;
        if self.len + s.len() > cap {
            return Err(core::fmt::Error);
        }
        // SAFETY: sysfs hands show() a buffer of PAGE_SIZE bytes; the bound
        // is checked just above.
        unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), self.buf.add(self.len), s.len()) };
        self.len += s.len();
        Ok(())
    }
}

unsafe extern "C" fn show<const WHAT: u8>(
    dev: *mut bindings::device,
    _attr: *mut bindings::device_attribute,
    buf: *mut kernel::ffi::c_char,
) -> isize {
    // SAFETY: sysfs calls this only for attributes `create` put on a
    // MiscHolder's device, while the device is registered.
    let npu = unsafe { npu_of(dev) };
    let mut out = Page { buf: buf.cast(), len: 0 };
    let r = match WHAT {
        w if w == Show::HwVersion as u8 => writeln!(out, "{}.{}", npu.hw.version >> 16, npu.hw.version & 0xffff),
        w if w == Show::DriverVersion as u8 => {
            let (ma, mi, pa) = crate::DRIVER_VERSION;
            writeln!(out, "{}.{}.{}", ma, mi, pa)
        }
        w if w == Show::DramTotal as u8 => writeln!(out, "{}", npu.hw.dram_size),
        w if w == Show::DramUsed as u8 => {
            // Saturating: a snapshot that ever showed more free than total
            // must not become an overflow panic on a sysfs read.
            writeln!(out, "{}", npu.hw.dram_size.saturating_sub(npu.stats().dram_free))
        }
        w if w == Show::Utilization as u8 => writeln!(out, "{}", npu.utilization()),
        w if w == Show::Health as u8 => writeln!(out, "{}", uapi::health_name(npu.stats().health)),
        w if w == Show::ResetCount as u8 => writeln!(out, "{}", npu.stats().resets),
        w if w == Show::Faults as u8 => writeln!(out, "{}", npu.stats().faults),
        w if w == Show::PciAddress as u8 => {
            let dev: &kernel::device::Device = npu.pdev.as_ref();
            writeln!(out, "{}", dev.name().to_str().unwrap_or("?"))
        }
        _ => Ok(()),
    };
    match r {
        Ok(()) => out.len as isize,
        Err(_) => EOVERFLOW.to_errno() as isize,
    }
}

/// `echo 1 > reset`: the privileged reset (`Npu::reset`). The file is
/// root-only (0200); CAP_SYS_ADMIN is checked as well.
unsafe extern "C" fn store_reset(
    dev: *mut bindings::device,
    _attr: *mut bindings::device_attribute,
    buf: *const kernel::ffi::c_char,
    count: usize,
) -> isize {
    // SAFETY: no pointer arguments; asks about the current task.
    if !unsafe { bindings::capable(bindings::CAP_SYS_ADMIN as i32) } {
        return EPERM.to_errno() as isize;
    }
    // SAFETY: sysfs passes `count` readable bytes at `buf`.
    let input = unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), count) };
    let value = input.strip_suffix(b"\n").unwrap_or(input);
    if value != b"1" {
        return EINVAL.to_errno() as isize;
    }
    // SAFETY: as for `show`.
    let npu = unsafe { npu_of(dev) };
    match npu.reset() {
        Ok(()) => count as isize,
        Err(e) => e.to_errno() as isize,
    }
}
