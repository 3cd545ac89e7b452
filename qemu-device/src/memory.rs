//! What the device can reach: guest RAM shared by QEMU (by bus address)
//! and its own DRAM (by offset). Every access is bounds-checked and turns
//! into a [`BusError`] instead of touching memory the guest did not share.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use memmap2::{MmapOptions, MmapRaw};

/// An access outside shared guest memory or outside DRAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bus error at {addr:#x} (+{len})")]
pub struct BusError {
    pub addr: u64,
    pub len: u64,
}

/// A mapping of a file range (or of anonymous memory), accessed with raw
/// copies.
///
/// The guest (or QEMU) may write the same memory concurrently: this is
/// shared memory with another party, so every access is a plain byte copy
/// through raw pointers, never a Rust reference into the mapping.
pub struct Mapping {
    map: MmapRaw,
}

impl Mapping {
    /// Map `len` bytes of `file` at `offset`, shared and writable.
    pub fn new(file: &File, offset: u64, len: u64) -> std::io::Result<Self> {
        let len = usize::try_from(len).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let map = MmapOptions::new().offset(offset).len(len).map_raw(file)?;
        Ok(Self { map })
    }

    /// `len` bytes of private anonymous memory, zero until written, with
    /// transparent huge pages requested: memory only the device reaches.
    pub fn anonymous(len: u64) -> std::io::Result<Self> {
        let len = usize::try_from(len).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let map = MmapRaw::from(MmapOptions::new().len(len).map_anon()?);
        // 2 MiB pages where the host allows them (THP "always" or
        // "madvise"): the kernels stream megabytes of weights and
        // activations per op, and with 4 KiB pages every 4 KiB is a TLB
        // miss, a two-dimensional page walk when the host is itself a
        // virtual machine. Refused (no THP): 4 KiB pages, as before.
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(Self { map })
    }

    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    fn check(&self, off: u64, len: usize) -> Result<usize, BusError> {
        let end = off.checked_add(len as u64);
        match end {
            Some(end) if end <= self.len() => Ok(off as usize),
            _ => Err(BusError { addr: off, len: len as u64 }),
        }
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), BusError> {
        let off = self.check(off, buf.len())?;
        // SAFETY: `check` keeps [off, off+len) inside the mapping, which
        // lives as long as `self`; `buf` is a distinct Rust allocation, so
        // the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(off), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    pub fn write(&self, off: u64, buf: &[u8]) -> Result<(), BusError> {
        let off = self.check(off, buf.len())?;
        // SAFETY: as in `read`; the mapping is writable (map_raw maps
        // read-write shared).
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), self.map.as_mut_ptr().add(off), buf.len()) };
        Ok(())
    }

    /// Raw pointer to [off, off+len) of the mapping, for in-place access
    /// by device engines. Valid while `self` lives.
    pub fn ptr(&self, off: u64, len: u64) -> Result<*mut u8, BusError> {
        let n = usize::try_from(len).map_err(|_| BusError { addr: off, len })?;
        let off = self.check(off, n)?;
        // SAFETY: `check` keeps off inside the mapping, so the offset
        // pointer stays in (or one past) the same allocation.
        Ok(unsafe { self.map.as_mut_ptr().add(off) })
    }

    pub fn fill(&self, off: u64, len: u64, pattern: u32) -> Result<(), BusError> {
        let n = usize::try_from(len).map_err(|_| BusError { addr: off, len })?;
        self.check(off, n)?;
        // Copy a pattern chunk rather than storing byte by byte.
        let chunk: Vec<u8> = pattern.to_le_bytes().iter().copied().cycle().take(n.min(64 * 1024)).collect();
        let mut done = 0usize;
        while done < n {
            let k = chunk.len().min(n - done);
            self.write(off + done as u64, &chunk[..k])?;
            done += k;
        }
        Ok(())
    }
}

/// One DMA region QEMU mapped: guest bus addresses [addr, addr+len).
struct HostRegion {
    addr: u64,
    map: Arc<Mapping>,
}

/// Guest RAM regions shared with the device, by bus address.
#[derive(Default)]
pub struct HostMemory {
    regions: RwLock<Vec<HostRegion>>,
    /// Bumped by every change of `regions`: lets a command processor keep
    /// a region it looked up (see [`HostMemory::region`]) until it changes.
    generation: AtomicU64,
}

impl HostMemory {
    /// Add a region (DMA_MAP). Overlapping an existing region is refused.
    pub fn map(&self, addr: u64, map: Mapping) -> Result<(), BusError> {
        let len = map.len();
        let end = addr.checked_add(len).ok_or(BusError { addr, len })?;
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if regions.iter().any(|r| addr < r.addr + r.map.len() && r.addr < end) {
            return Err(BusError { addr, len });
        }
        regions.push(HostRegion { addr, map: Arc::new(map) });
        regions.sort_by_key(|r| r.addr);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Remove every region overlapping [addr, addr+len) (DMA_UNMAP; QEMU
    /// unmaps whole regions). In-flight accesses keep their mapping alive
    /// until they finish.
    pub fn unmap(&self, addr: u64, len: u64) {
        let end = addr.saturating_add(len);
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        regions.retain(|r| !(addr < r.addr + r.map.len() && r.addr < end));
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn clear(&self) {
        self.regions.write().unwrap_or_else(|e| e.into_inner()).clear();
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Changes whenever a region is added or removed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The region holding [addr, addr+len): its first bus address and its
    /// mapping (kept alive by the caller as long as it uses it).
    pub fn region(&self, addr: u64, len: u64) -> Result<(u64, Arc<Mapping>), BusError> {
        let (map, off) = self.find(addr, len)?;
        Ok((addr - off, map))
    }

    /// The region holding [addr, addr+len), and addr's offset in it.
    fn find(&self, addr: u64, len: u64) -> Result<(Arc<Mapping>, u64), BusError> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let end = addr.checked_add(len).ok_or(BusError { addr, len })?;
        regions
            .iter()
            .find(|r| addr >= r.addr && end <= r.addr + r.map.len())
            .map(|r| (r.map.clone(), addr - r.addr))
            .ok_or(BusError { addr, len })
    }

    /// The mapping holding [addr, addr+len) and a pointer to addr in it;
    /// the pointer is valid while the returned mapping is kept alive.
    pub fn pin(&self, addr: u64, len: u64) -> Result<(Arc<Mapping>, *mut u8), BusError> {
        let (m, off) = self.find(addr, len)?;
        let p = m.ptr(off, len)?;
        Ok((m, p))
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), BusError> {
        let (m, off) = self.find(addr, buf.len() as u64)?;
        m.read(off, buf).map_err(|_| BusError { addr, len: buf.len() as u64 })
    }

    pub fn write(&self, addr: u64, buf: &[u8]) -> Result<(), BusError> {
        let (m, off) = self.find(addr, buf.len() as u64)?;
        m.write(off, buf).map_err(|_| BusError { addr, len: buf.len() as u64 })
    }

    pub fn read_u64(&self, addr: u64) -> Result<u64, BusError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Create an anonymous memory file of `size` bytes (device DRAM, or fake
/// guest RAM in tests).
pub fn memfd(name: &str, size: u64) -> std::io::Result<File> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC).map_err(std::io::Error::from)?;
    let file = File::from(fd);
    file.set_len(size)?;
    Ok(file)
}

/// Device DRAM: private memory of the device model or, when the guest may
/// map BAR2 directly, a memfd shared with the VMM.
pub struct Dram {
    /// The memfd behind a shareable DRAM.
    file: Option<File>,
    map: Mapping,
}

impl Dram {
    /// `size` bytes of DRAM; `shareable`: backed by a memfd that [`file`]
    /// offers to the VMM (4 KiB pages: shared memory gets huge pages only
    /// where the host's shmem THP policy allows), else anonymous memory
    /// with huge pages requested.
    ///
    /// [`file`]: Dram::file
    pub fn new(size: u64, shareable: bool) -> std::io::Result<Self> {
        if !shareable {
            return Ok(Self { file: None, map: Mapping::anonymous(size)? });
        }
        let file = memfd("rbln-dram", size)?;
        let map = Mapping::new(&file, 0, size)?;
        Ok(Self { file: Some(file), map })
    }

    pub fn size(&self) -> u64 {
        self.map.len()
    }

    /// The memfd, offered to QEMU so BAR2 is mapped without trapping;
    /// None for DRAM made not shareable.
    pub fn file(&self) -> Option<&File> {
        self.file.as_ref()
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), BusError> {
        self.map.read(off, buf)
    }

    pub fn write(&self, off: u64, buf: &[u8]) -> Result<(), BusError> {
        self.map.write(off, buf)
    }

    /// Pointer to [off, off+len) of DRAM, valid while `self` lives.
    pub fn ptr(&self, off: u64, len: u64) -> Result<*mut u8, BusError> {
        self.map.ptr(off, len)
    }
}
