// SPDX-License-Identifier: GPL-2.0

//! `/dev/rblnN`: open files and their ioctls.

use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    prelude::*,
    sync::Arc,
    uaccess::{UserPtr, UserSlice},
};

use crate::ctx::Context;
use crate::npu::{MiscHolder, Npu};
use crate::uapi;

/// The uAPI structs are plain old data: `#[repr(C)]`, integer fields only,
/// no padding (each asserted at compile time in uapi/src/lib.rs).
macro_rules! pod {
    ($($t:ident),*) => {$(
        // SAFETY: see above: every bit pattern is valid and every byte is
        // initialised.
        unsafe impl kernel::transmute::FromBytes for uapi::$t {}
        // SAFETY: as above.
        unsafe impl kernel::transmute::AsBytes for uapi::$t {}
    )*};
}
pod!(DeviceInfo, BoCreate, BoInfo, BoDestroy, VmMap, VmUnmap, QueueCreate, QueueDestroy, Submit, FenceWait, DeviceStats);

/// One open file: a context on one device.
pub(crate) struct RblnFile {
    npu: Arc<Npu>,
    ctx: Pin<KBox<Context>>,
    /// Unique among all files opened since the module was loaded (context
    /// numbers are reused), as `drm-client-id` requires.
    client_id: u64,
}

/// The last `drm-client-id` handed out.
static CLIENT_IDS: kernel::sync::atomic::Atomic<u64> = kernel::sync::atomic::Atomic::new(0);

/// Copy an ioctl argument struct in, following the uAPI's size rule:
/// `min(caller size, ours)` bytes are copied, the rest of ours is zero, and
/// any bytes the caller has beyond ours must be zero.
fn read_arg<T: kernel::transmute::FromBytes + kernel::transmute::AsBytes + Default>(
    arg: usize,
    user_size: usize,
) -> Result<T> {
    let mut v = T::default();
    let ours = core::mem::size_of::<T>();
    let n = user_size.min(ours);
    let mut reader = UserSlice::new(UserPtr::from_addr(arg), user_size).reader();
    reader.read_slice(&mut v.as_bytes_mut()[..n])?;
    if user_size > ours {
        let mut extra = [0u8; 64];
        let mut left = user_size - ours;
        while left > 0 {
            let k = left.min(extra.len());
            reader.read_slice(&mut extra[..k])?;
            if extra[..k].iter().any(|&b| b != 0) {
                return Err(E2BIG);
            }
            left -= k;
        }
    }
    Ok(v)
}

/// Copy an ioctl result back: `min(caller size, ours)` bytes.
fn write_arg<T: kernel::transmute::AsBytes>(arg: usize, user_size: usize, v: &T) -> Result {
    let bytes = v.as_bytes();
    let n = user_size.min(bytes.len());
    UserSlice::new(UserPtr::from_addr(arg), n).writer().write_slice(&bytes[..n])
}

impl RblnFile {
    fn info(&self) -> uapi::DeviceInfo {
        let hw = &self.npu.hw;
        let (ma, mi, pa) = crate::DRIVER_VERSION;
        uapi::DeviceInfo {
            uapi_version: uapi::UAPI_VERSION,
            driver_version: ma << 16 | mi << 8 | pa,
            vendor_id: crate::hw::pci::VENDOR_ID,
            device_id: crate::hw::pci::DEVICE_ID,
            hw_version: hw.version,
            dram_size: hw.dram_size,
            num_queues: hw.num_queues,
            num_cores: hw.num_cores,
            num_dma_engines: hw.num_dma_engines,
            caps: hw.caps,
            minor_index: self.npu.index as u32,
            ..Default::default()
        }
    }
}

#[vtable]
impl MiscDevice for RblnFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let reg = core::ptr::from_ref(misc).cast_mut();
        // SAFETY: every `MiscDeviceRegistration<RblnFile>` is the `reg` field
        // of a pinned `MiscHolder` (npu.rs creates no other), so stepping back
        // to the container stays inside that allocation; the registration,
        // hence the holder, outlives every call of `open`.
        let npu = unsafe { &(*kernel::container_of!(reg, MiscHolder, reg)).npu }.clone();
        let ctx = Context::new(npu.clone())?;
        let client_id = CLIENT_IDS.fetch_add(1, kernel::sync::atomic::Relaxed) + 1;
        Ok(KBox::pin(RblnFile { npu, ctx, client_id }, GFP_KERNEL)?)
    }

    fn ioctl(me: Pin<&RblnFile>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        let (ty, nr, size) = uapi::decode(cmd);
        // Every call is _IOWR with at least the first version's struct.
        if ty != uapi::IOCTL_TYPE || cmd >> 30 != 3 {
            return Err(ENOTTY);
        }
        match uapi::MIN_ARG_SIZE.get(nr as usize) {
            Some(&min) if size < min => return Err(EINVAL),
            Some(_) => {}
            None => return Err(ENOTTY),
        }
        // Every call: read the argument (size rule), act, write it back.
        macro_rules! call {
            ($t:ty, $f:expr) => {{
                let mut a = read_arg::<$t>(arg, size)?;
                #[allow(clippy::redundant_closure_call)]
                ($f)(&mut a)?;
                write_arg(arg, size, &a)?;
            }};
        }
        let ctx = &me.ctx;
        match nr {
            // Output only, but the size rule still applies to what the caller passes.
            0x00 => call!(uapi::DeviceInfo, |a: &mut uapi::DeviceInfo| -> Result {
                *a = me.info();
                Ok(())
            }),
            0x01 => call!(uapi::BoCreate, |a: &mut uapi::BoCreate| ctx.bo_create(a)),
            0x02 => call!(uapi::BoInfo, |a: &mut uapi::BoInfo| ctx.bo_info(a)),
            0x03 => call!(uapi::BoDestroy, |a: &mut uapi::BoDestroy| ctx.bo_destroy(a)),
            0x04 => call!(uapi::VmMap, |a: &mut uapi::VmMap| ctx.vm_map(a)),
            0x05 => call!(uapi::VmUnmap, |a: &mut uapi::VmUnmap| ctx.vm_unmap(a)),
            0x06 => call!(uapi::QueueCreate, |a: &mut uapi::QueueCreate| ctx.queue_create(a)),
            0x07 => call!(uapi::QueueDestroy, |a: &mut uapi::QueueDestroy| ctx.queue_destroy(a)),
            0x08 => call!(uapi::Submit, |a: &mut uapi::Submit| ctx.submit(a)),
            0x09 => call!(uapi::FenceWait, |a: &mut uapi::FenceWait| ctx.fence_wait(a)),
            0x0a => call!(uapi::DeviceStats, |a: &mut uapi::DeviceStats| -> Result {
                *a = me.npu.stats();
                Ok(())
            }),
            _ => return Err(ENOTTY),
        }
        Ok(0)
    }

    /// `/proc/<pid>/fdinfo/<fd>`: the keys of the kernel's DRM/accel
    /// client usage statistics (Documentation/gpu/drm-usage-stats.rst) and
    /// rbln's own (docs/uapi.md, "fdinfo").
    fn show_fdinfo(me: Pin<&RblnFile>, m: &kernel::seq_file::SeqFile, _file: &File) {
        let u = me.ctx.usage();
        kernel::seq_print!(m, "drm-driver:\trbln\n");
        kernel::seq_print!(m, "drm-client-id:\t{}\n", me.client_id);
        // One engine, "npu": the time this client's queues executed packets
        // (several queues of one client can add up to more than wall time).
        kernel::seq_print!(m, "drm-engine-npu:\t{} ns\n", u.busy_ns);
        // Every buffer is resident: none is ever swapped or evicted.
        for (region, bytes) in [("host", u.host_bytes), ("dram", u.dram_bytes)] {
            kernel::seq_print!(m, "drm-total-{}:\t{} KiB\n", region, bytes / 1024);
            kernel::seq_print!(m, "drm-resident-{}:\t{} KiB\n", region, bytes / 1024);
        }
        kernel::seq_print!(m, "rbln-device:\t{}\n", me.npu.index);
        kernel::seq_print!(m, "rbln-context:\t{}\n", me.ctx.id());
        kernel::seq_print!(m, "rbln-buffers:\t{}\n", u.bos);
        kernel::seq_print!(m, "rbln-queues:\t{}\n", u.queues);
        kernel::seq_print!(m, "rbln-submits:\t{}\n", u.submits);
    }

    fn mmap(me: Pin<&RblnFile>, _file: &File, vma: &kernel::mm::virt::VmaNew) -> Result {
        // SAFETY: `vma` is the live VMA being set up by this mmap call.
        let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff } as u64;
        let (kind, id) = uapi::mmap_decode(pgoff << 12).ok_or(EINVAL)?;
        // Private (copy-on-write) mappings would hide writes from the device.
        if vma.flags() & kernel::bindings::VM_SHARED == 0 {
            return Err(EINVAL);
        }
        match kind {
            uapi::MMAP_KIND_BO => {
                let len = vma.end() - vma.start();
                me.ctx.with_bo_mem(id, |mem| mem.mmap(vma, len))
            }
            _ => me.ctx.mmap_queue(kind, id, vma),
        }
    }
}
