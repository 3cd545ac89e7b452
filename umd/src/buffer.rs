//! Buffer objects: device DRAM or host memory, mapped into the device VA
//! space, and (host buffers) into this process.

use std::sync::{Arc, Mutex};

use bytemuck::Pod;
use rbln_uapi as uapi;

use crate::device::{Device, DeviceInner};
use crate::error::{Error, Op, Result};
use crate::sys::{Mapping, Prot};

/// Where a buffer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Host (guest) memory: the CPU reads and writes it directly, the
    /// device reaches it by DMA. Use it for staging, command buffers and
    /// results.
    Host,
    /// Device DRAM: fast for the compute cores, reached only by the device
    /// (DMA copies from and to host buffers); no CPU mapping.
    Dram,
}

/// Device access permissions of a VA mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Perms(u32);

impl Perms {
    pub const READ: Perms = Perms(uapi::VM_READ);
    pub const WRITE: Perms = Perms(uapi::VM_WRITE);
    pub const RW: Perms = Perms(uapi::VM_READ | uapi::VM_WRITE);

    /// From `VM_READ`/`VM_WRITE` bits; `None` for unknown bits or none.
    pub fn from_bits(bits: u32) -> Option<Perms> {
        (bits != 0 && bits & !(uapi::VM_READ | uapi::VM_WRITE) == 0).then_some(Perms(bits))
    }

    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn contains(self, other: Perms) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Perms {
    type Output = Perms;
    fn bitor(self, rhs: Perms) -> Perms {
        Perms(self.0 | rhs.0)
    }
}

#[derive(Clone, Copy, Debug)]
struct VaMap {
    va: u64,
    perms: Perms,
}

/// A buffer object of one device context.
///
/// Dropping it removes its device VA mappings and its CPU mapping and frees
/// the memory. Work still in flight that uses the buffer then faults (and
/// poisons the context): wait for its fences first.
///
/// CPU access ([`write_slice`](Self::write_slice),
/// [`read_vec`](Self::read_vec), …) is for [`Placement::Host`] buffers and
/// takes `&self`: the memory is shared with the device and between
/// threads, and is accessed word by word with atomic loads and stores, so
/// concurrent use is defined (overlapping concurrent writes leave one of
/// the values per word).
#[derive(Debug)]
pub struct Buffer {
    pub(crate) dev: Arc<DeviceInner>,
    handle: u32,
    size: u64,
    placement: Placement,
    cpu: Option<Mapping>,
    maps: Mutex<Vec<VaMap>>,
}

impl Device {
    /// Allocate a buffer of `size` bytes (1 ..= 1 GiB; memory is reserved
    /// in whole 4 KiB pages, zeroed). Host buffers are mapped into this
    /// process at once; map either kind into the device VA space with
    /// [`Buffer::map`].
    pub fn alloc(&self, size: u64, placement: Placement) -> Result<Buffer> {
        Buffer::new(&self.inner, size, placement)
    }
}

impl Buffer {
    pub(crate) fn new(dev: &Arc<DeviceInner>, size: u64, placement: Placement) -> Result<Buffer> {
        let flags = match placement {
            Placement::Host => uapi::BO_HOST,
            Placement::Dram => uapi::BO_DRAM,
        };
        let mut a = uapi::BoCreate { size, flags, ..Default::default() };
        dev.ioctl(&mut a)?;
        let mut buf =
            Buffer { dev: dev.clone(), handle: a.handle, size, placement, cpu: None, maps: Mutex::new(Vec::new()) };
        if placement == Placement::Host {
            let mut info = uapi::BoInfo { handle: a.handle, ..Default::default() };
            dev.ioctl(&mut info)?;
            let len = usize::try_from(info.size).map_err(|_| Error::InvalidInput("buffer too large to map".into()))?;
            buf.cpu = Some(
                Mapping::new(&dev.file, info.mmap_offset, len, Prot::ReadWrite)
                    .map_err(|e| Error::from_errno(Op::MmapBo, e))?,
            );
        }
        Ok(buf)
    }

    /// Size in bytes as requested at allocation.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The driver's handle (for diagnostics).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Map the whole buffer into the device VA space with `perms`; the
    /// driver chooses the VA, which is returned. A buffer may be mapped
    /// several times (e.g. read-only and read-write); every mapping is
    /// removed when the buffer is dropped, or with [`unmap`](Self::unmap).
    pub fn map(&self, perms: Perms) -> Result<u64> {
        let mut a = uapi::VmMap { handle: self.handle, flags: perms.bits(), ..Default::default() };
        self.dev.ioctl(&mut a)?;
        self.maps.lock().unwrap_or_else(|e| e.into_inner()).push(VaMap { va: a.va, perms });
        Ok(a.va)
    }

    /// Remove the device VA mapping that starts at `va`.
    pub fn unmap(&self, va: u64) -> Result<()> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let i = maps
            .iter()
            .position(|m| m.va == va)
            .ok_or(Error::NotFound { op: Op::VmUnmap, hint: "this buffer has no mapping at that device VA" })?;
        let mut a = uapi::VmUnmap { va, ..Default::default() };
        self.dev.ioctl(&mut a)?;
        maps.remove(i);
        Ok(())
    }

    /// Device VA of the buffer's first mapping.
    pub fn device_va(&self) -> Result<u64> {
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.first().map(|m| m.va).ok_or(Error::NotMapped { handle: self.handle })
    }

    /// Device VA of `[offset, offset + len)` in a mapping with at least
    /// `need`, for a command that does `what`. Checks bounds, mapping and
    /// permission, so mistakes are reported here rather than as a device
    /// fault that poisons the context.
    pub(crate) fn va_range(&self, offset: u64, len: u64, need: Perms, what: &'static str) -> Result<u64> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfBounds { what, offset, len, size: self.size });
        }
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let first = maps.first().ok_or(Error::NotMapped { handle: self.handle })?;
        let m = maps.iter().find(|m| m.perms.contains(need)).ok_or(Error::PermissionMissing {
            handle: self.handle,
            what,
            needed: if need.contains(Perms::WRITE) && !first.perms.contains(Perms::WRITE) { "WRITE" } else { "READ" },
        })?;
        Ok(m.va + offset)
    }

    pub(crate) fn check_device(&self, dev: &Arc<DeviceInner>) -> Result<()> {
        if Arc::ptr_eq(&self.dev, dev) {
            Ok(())
        } else {
            Err(Error::ForeignDevice { handle: self.handle })
        }
    }

    fn cpu(&self, what: &'static str, offset: u64, len: usize) -> Result<(&Mapping, usize)> {
        let m = self.cpu.as_ref().ok_or(Error::NotHostVisible)?;
        let len = len as u64;
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfBounds { what, offset, len, size: self.size });
        }
        Ok((m, offset as usize))
    }

    /// Copy `data` into the buffer at byte `offset` (host buffers).
    pub fn write_slice<T: Pod>(&self, offset: u64, data: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let (m, off) = self.cpu("write", offset, bytes.len())?;
        m.copy_in(off, bytes);
        Ok(())
    }

    /// Copy `out.len()` elements out of the buffer at byte `offset`.
    pub fn read_slice<T: Pod>(&self, offset: u64, out: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let (m, off) = self.cpu("read", offset, bytes.len())?;
        m.copy_out(off, bytes);
        Ok(())
    }

    /// `n` elements read from byte `offset`, copied straight into a new
    /// vector (no zero-fill first: under TCG, a pass over the bytes costs
    /// as much as the copy, 4.5 ms for 16 MiB).
    pub fn read_vec<T: Pod>(&self, offset: u64, n: usize) -> Result<Vec<T>> {
        let len = n.checked_mul(size_of::<T>()).ok_or(Error::OutOfBounds { what: "read", offset, len: u64::MAX, size: self.size })?;
        let (m, off) = self.cpu("read", offset, len)?;
        let mut v = Vec::<T>::with_capacity(n);
        // SAFETY: the vector's spare capacity holds n elements (len bytes),
        // all of which the copy writes; T is Pod, so any bytes are a valid T.
        unsafe {
            m.copy_out_raw(off, v.as_mut_ptr().cast::<u8>(), len);
            v.set_len(n);
        }
        Ok(v)
    }

    /// Write one value at byte `offset`.
    pub fn write<T: Pod>(&self, offset: u64, value: T) -> Result<()> {
        self.write_slice(offset, std::slice::from_ref(&value))
    }

    /// Read one value at byte `offset` (e.g. a device timestamp, a `u64`).
    pub fn read<T: Pod>(&self, offset: u64) -> Result<T> {
        let mut v = T::zeroed();
        self.read_slice(offset, std::slice::from_mut(&mut v))?;
        Ok(v)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let maps = std::mem::take(self.maps.get_mut().unwrap_or_else(|e| e.into_inner()));
        for m in maps {
            let _ = self.dev.ioctl(&mut uapi::VmUnmap { va: m.va, ..Default::default() });
        }
        self.cpu = None;
        let _ = self.dev.ioctl(&mut uapi::BoDestroy { handle: self.handle, ..Default::default() });
    }
}

#[cfg(test)]
impl Buffer {
    /// A buffer for host tests (see `Device::fake`), mapped at `maps`.
    pub(crate) fn fake(dev: &Device, handle: u32, size: u64, placement: Placement, maps: &[(u64, Perms)]) -> Buffer {
        Buffer {
            dev: dev.inner.clone(),
            handle,
            size,
            placement,
            cpu: None,
            maps: Mutex::new(maps.iter().map(|&(va, perms)| VaMap { va, perms }).collect()),
        }
    }
}
