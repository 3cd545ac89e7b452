//! Command buffers: a typed builder over [`rbln_hw::cmd::Encoder`] whose
//! bytes (commands and compute descriptors) live in a host buffer mapped
//! into the device VA space.

use std::sync::Arc;
use std::time::Duration;

use rbln_hw::cmd::{self, Encoder};
use rbln_hw::ops;

use crate::buffer::{Buffer, Perms, Placement};
use crate::device::{Device, DeviceInner};
use crate::error::{Error, Result};
use crate::queue::Fence;

/// Largest compute descriptor (the hardware contract's limit).
pub use rbln_hw::ops::MAX_DESC_SIZE;

/// Default room for commands and for descriptors, each.
pub const DEFAULT_COMMAND_BYTES: u64 = 32 << 10;
pub const DEFAULT_DESCRIPTOR_BYTES: u64 = 32 << 10;

/// SEM_WAIT conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemCond {
    /// The u64 equals the value.
    Eq,
    /// The u64 is (unsigned) greater than or equal to the value.
    Ge,
}

/// SEM_SIGNAL operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemOp {
    /// Set the u64 to the value.
    Set,
    /// Add the value to the u64 (atomically).
    Add,
}

/// A compute descriptor of [`rbln_hw::ops`] (GEMM, convolution, …): its
/// header is filled in when encoded.
pub trait Descriptor: Copy {
    /// The descriptor's bytes, header included.
    fn encode(&self) -> Vec<u8>;
}

macro_rules! descriptors {
    ($($t:ident),*) => {$(
        impl Descriptor for ops::$t {
            fn encode(&self) -> Vec<u8> {
                self.with_header().to_bytes().to_vec()
            }
        }
    )*};
}
descriptors!(
    GemmDesc,
    Conv2dDesc,
    PoolDesc,
    BinaryDesc,
    UnaryDesc,
    SoftmaxDesc,
    LayerNormDesc,
    ReduceDesc,
    TransposeDesc,
    StridedCopyDesc,
    GatherDesc
);

/// A GEMM descriptor `C[m,n] = A[m,k] * B[k,n]` (fp32, row-major, batch 1,
/// no bias or activation) over device VAs; adjust fields for the rest.
pub fn gemm_desc(m: u32, n: u32, k: u32, a_va: u64, b_va: u64, c_va: u64) -> ops::GemmDesc {
    ops::GemmDesc { m, n, k, batch: 1, a_va, b_va, c_va, ..Default::default() }.with_header()
}

/// A command buffer being built, and the host buffer its bytes go to.
///
/// Build it with the methods below (each appends one packet), submit it to
/// a [`Queue`](crate::Queue) or [`UserQueue`](crate::UserQueue), and
/// resubmit it as often as wanted: unchanged bytes are not copied again.
/// Changing it while its last submission still executes is refused at the
/// next submission ([`Error::CommandBufferBusy`]); dropping it waits (up
/// to 10 s) for that submission.
///
/// Methods taking a [`Buffer`] check bounds, mapping and permissions (an
/// error here instead of a device fault that poisons the context); the
/// `*_va` methods take raw device VAs and are checked only by the device
/// MMU.
pub struct CommandBuffer {
    dev: Arc<DeviceInner>,
    /// `None` only after drop decided to leak it (see `Drop`).
    bo: Option<Buffer>,
    va: u64,
    cmd_cap: u64,
    desc_cap: u64,
    enc: Encoder<Vec<u8>>,
    descs: Vec<u8>,
    dirty: bool,
    last: Option<Fence>,
}

impl std::fmt::Debug for CommandBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandBuffer")
            .field("va", &format_args!("{:#x}", self.va))
            .field("command_bytes", &self.enc.len())
            .field("descriptor_bytes", &self.descs.len())
            .field("capacity", &(self.cmd_cap, self.desc_cap))
            .field("last", &self.last.as_ref().map(|f| (f.queue_id(), f.value())))
            .finish()
    }
}

impl CommandBuffer {
    /// A command buffer with room for [`DEFAULT_COMMAND_BYTES`] of commands
    /// and [`DEFAULT_DESCRIPTOR_BYTES`] of descriptors.
    pub fn new(dev: &Device) -> Result<CommandBuffer> {
        Self::with_capacity(dev, DEFAULT_COMMAND_BYTES, DEFAULT_DESCRIPTOR_BYTES)
    }

    /// A command buffer with room for `command_bytes` of commands (at most
    /// 16 MiB) and `descriptor_bytes` of compute descriptors.
    pub fn with_capacity(dev: &Device, command_bytes: u64, descriptor_bytes: u64) -> Result<CommandBuffer> {
        if command_bytes == 0 || command_bytes > rbln_hw::ring::MAX_CMDBUF_SIZE as u64 {
            return Err(Error::InvalidInput(format!(
                "a command buffer holds 1 ..= {} bytes of commands, not {command_bytes}",
                rbln_hw::ring::MAX_CMDBUF_SIZE
            )));
        }
        let cmd_cap = command_bytes.div_ceil(8) * 8;
        let desc_cap = descriptor_bytes.div_ceil(8) * 8;
        let bo = Buffer::new(&dev.inner, cmd_cap + desc_cap.max(8), Placement::Host)?;
        let va = bo.map(Perms::READ)?;
        Ok(CommandBuffer {
            dev: dev.inner.clone(),
            bo: Some(bo),
            va,
            cmd_cap,
            desc_cap,
            enc: Encoder::new(Vec::new()),
            descs: Vec::new(),
            dirty: true,
            last: None,
        })
    }

    /// Encoded command bytes so far.
    pub fn len(&self) -> usize {
        self.enc.len()
    }

    pub fn is_empty(&self) -> bool {
        self.enc.is_empty()
    }

    /// The encoded commands (what the device will execute).
    pub fn commands(&self) -> &[u8] {
        &self.enc.buf
    }

    /// Device VA of the command bytes.
    pub fn device_va(&self) -> u64 {
        self.va
    }

    /// The fence of the last submission, if any.
    pub fn last_fence(&self) -> Option<&Fence> {
        self.last.as_ref()
    }

    /// Remove every command and descriptor.
    pub fn reset(&mut self) -> &mut Self {
        self.enc.buf.clear();
        self.descs.clear();
        self.dirty = true;
        self
    }

    fn touch(&mut self) -> &mut Encoder<Vec<u8>> {
        self.dirty = true;
        &mut self.enc
    }

    // ---- raw packets over device VAs ------------------------------------

    /// NOP.
    pub fn nop(&mut self) -> &mut Self {
        self.touch().nop();
        self
    }

    /// DMA_COPY of `size` bytes (at most 1 GiB) from `src_va` to `dst_va`.
    pub fn dma_copy_va(&mut self, src_va: u64, dst_va: u64, size: u64) -> &mut Self {
        self.touch().dma_copy(src_va, dst_va, size);
        self
    }

    /// FILL `size` bytes at `dst_va` with the 32-bit `value`.
    pub fn fill_va(&mut self, dst_va: u64, size: u64, value: u32) -> &mut Self {
        self.touch().fill(dst_va, size, value);
        self
    }

    /// COMPUTE with the descriptor of `desc_size` bytes at `desc_va`.
    pub fn compute_va(&mut self, desc_va: u64, desc_size: u32) -> &mut Self {
        self.touch().compute(desc_va, desc_size);
        self
    }

    /// SEM_WAIT until the u64 at `addr_va` satisfies `cond` against `value`.
    pub fn sem_wait_va(&mut self, addr_va: u64, value: u64, cond: SemCond) -> &mut Self {
        let c = match cond {
            SemCond::Eq => cmd::SEM_COND_EQ,
            SemCond::Ge => cmd::SEM_COND_GE,
        };
        self.touch().sem_wait(addr_va, value, c);
        self
    }

    /// SEM_SIGNAL: set or add `value` to the u64 at `addr_va`.
    pub fn sem_signal_va(&mut self, addr_va: u64, value: u64, op: SemOp) -> &mut Self {
        let o = match op {
            SemOp::Set => cmd::SEM_OP_SET,
            SemOp::Add => cmd::SEM_OP_ADD,
        };
        self.touch().sem_signal(addr_va, value, o);
        self
    }

    /// TIMESTAMP: the device clock (u64 ns) to `addr_va` once every earlier
    /// packet of the queue completed.
    pub fn timestamp_va(&mut self, addr_va: u64) -> &mut Self {
        self.touch().timestamp(addr_va);
        self
    }

    /// INDIRECT: run the command buffer of `size` bytes at `va`, then
    /// continue here.
    pub fn indirect_va(&mut self, va: u64, size: u32) -> &mut Self {
        self.touch().indirect(va, size);
        self
    }

    // ---- checked packets over buffers -----------------------------------

    /// DMA copy `size` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset` (host ↔ DRAM ↔ host, any direction).
    pub fn copy(&mut self, src: &Buffer, src_offset: u64, dst: &Buffer, dst_offset: u64, size: u64) -> Result<&mut Self> {
        self.same(src)?;
        self.same(dst)?;
        if size > cmd::MAX_DMA_SIZE {
            return Err(Error::InvalidInput(format!("one DMA copy moves at most {} bytes, not {size}", cmd::MAX_DMA_SIZE)));
        }
        let s = src.va_range(src_offset, size, Perms::READ, "DMA copy source")?;
        let d = dst.va_range(dst_offset, size, Perms::WRITE, "DMA copy destination")?;
        Ok(self.dma_copy_va(s, d, size))
    }

    /// Fill `size` bytes of `dst` at `offset` with the 32-bit `value`
    /// (offset and size multiples of 4).
    pub fn fill(&mut self, dst: &Buffer, offset: u64, size: u64, value: u32) -> Result<&mut Self> {
        self.same(dst)?;
        aligned("a fill's offset", offset, 4)?;
        aligned("a fill's size", size, 4)?;
        if size > cmd::MAX_DMA_SIZE {
            return Err(Error::InvalidInput(format!("one fill writes at most {} bytes, not {size}", cmd::MAX_DMA_SIZE)));
        }
        let d = dst.va_range(offset, size, Perms::WRITE, "fill destination")?;
        Ok(self.fill_va(d, size, value))
    }

    /// Write the device clock (u64 ns) into `buf` at `offset` (a multiple of
    /// 8). Read it back with [`Buffer::read::<u64>`](Buffer::read) (host
    /// buffers) once the fence signalled.
    pub fn timestamp(&mut self, buf: &Buffer, offset: u64) -> Result<&mut Self> {
        self.same(buf)?;
        aligned("a timestamp's offset", offset, 8)?;
        let va = buf.va_range(offset, 8, Perms::WRITE, "timestamp")?;
        Ok(self.timestamp_va(va))
    }

    /// Wait until the u64 in `buf` at `offset` satisfies `cond` against
    /// `value` (a cross-queue dependency).
    pub fn sem_wait(&mut self, buf: &Buffer, offset: u64, value: u64, cond: SemCond) -> Result<&mut Self> {
        self.same(buf)?;
        aligned("a semaphore's offset", offset, 8)?;
        let va = buf.va_range(offset, 8, Perms::READ, "semaphore wait")?;
        Ok(self.sem_wait_va(va, value, cond))
    }

    /// Set or add to the u64 in `buf` at `offset`.
    pub fn sem_signal(&mut self, buf: &Buffer, offset: u64, value: u64, op: SemOp) -> Result<&mut Self> {
        self.same(buf)?;
        aligned("a semaphore's offset", offset, 8)?;
        let va = buf.va_range(offset, 8, Perms::RW, "semaphore signal")?;
        Ok(self.sem_signal_va(va, value, op))
    }

    /// Call `other` (INDIRECT): its current contents are uploaded now, and
    /// it must not change while this buffer may still run.
    pub fn call(&mut self, other: &mut CommandBuffer) -> Result<&mut Self> {
        if !Arc::ptr_eq(&self.dev, &other.dev) {
            return Err(Error::ForeignDevice { handle: other.bo.as_ref().map_or(0, |b| b.handle()) });
        }
        let (va, size) = other.prepare()?;
        Ok(self.indirect_va(va, size))
    }

    /// Run the compute descriptor `desc`: it is stored in this command
    /// buffer's descriptor area.
    pub fn compute<D: Descriptor>(&mut self, desc: &D) -> Result<&mut Self> {
        self.compute_bytes(&desc.encode())
    }

    /// Run a compute descriptor given as bytes (header included; a
    /// multiple of 4 bytes, at most [`MAX_DESC_SIZE`]).
    pub fn compute_bytes(&mut self, desc: &[u8]) -> Result<&mut Self> {
        if desc.is_empty() || !desc.len().is_multiple_of(4) || desc.len() > MAX_DESC_SIZE {
            return Err(Error::InvalidInput(format!(
                "a compute descriptor is a multiple of 4 bytes in 4 ..= {MAX_DESC_SIZE}, not {}",
                desc.len()
            )));
        }
        let off = (self.descs.len() as u64).div_ceil(8) * 8;
        let need = off + desc.len() as u64;
        if need > self.desc_cap {
            return Err(Error::CommandBufferFull { what: "the descriptor area", need, capacity: self.desc_cap });
        }
        self.descs.resize(off as usize, 0);
        self.descs.extend_from_slice(desc);
        let va = self.va + self.cmd_cap + off;
        Ok(self.compute_va(va, desc.len() as u32))
    }

    /// `C = A * B` in fp32: A is `m×k` at `a.1` in `a.0`, B `k×n`, C `m×n`
    /// (row-major, densely packed, offsets multiples of 4).
    pub fn gemm(&mut self, m: u32, n: u32, k: u32, a: (&Buffer, u64), b: (&Buffer, u64), c: (&Buffer, u64)) -> Result<&mut Self> {
        let f = 4u64;
        let mut vas = [0u64; 3];
        for (i, ((buf, off), elems, need, what)) in [
            (a, m as u64 * k as u64, Perms::READ, "GEMM input A"),
            (b, k as u64 * n as u64, Perms::READ, "GEMM input B"),
            (c, m as u64 * n as u64, Perms::WRITE, "GEMM output C"),
        ]
        .into_iter()
        .enumerate()
        {
            self.same(buf)?;
            aligned(what, off, 4)?;
            vas[i] = buf.va_range(off, elems * f, need, what)?;
        }
        self.compute(&gemm_desc(m, n, k, vas[0], vas[1], vas[2]))
    }

    fn same(&self, buf: &Buffer) -> Result<()> {
        buf.check_device(&self.dev)
    }

    pub(crate) fn check_device(&self, dev: &Arc<DeviceInner>) -> Result<()> {
        if Arc::ptr_eq(&self.dev, dev) {
            Ok(())
        } else {
            Err(Error::ForeignDevice { handle: self.bo.as_ref().map_or(0, |b| b.handle()) })
        }
    }

    /// Upload the bytes if they changed; returns (VA, size) to submit.
    pub(crate) fn prepare(&mut self) -> Result<(u64, u32)> {
        if self.enc.is_empty() {
            return Err(Error::EmptyCommandBuffer);
        }
        let len = self.enc.len() as u64;
        if len > self.cmd_cap {
            return Err(Error::CommandBufferFull { what: "the command area", need: len, capacity: self.cmd_cap });
        }
        if self.dirty {
            if let Some(f) = &self.last {
                // A stopped queue (error) runs nothing more: safe to rewrite.
                if !f.poll().unwrap_or(true) {
                    return Err(Error::CommandBufferBusy { queue: f.queue_id(), fence: f.value() });
                }
            }
            let bo = self.bo.as_ref().ok_or(Error::EmptyCommandBuffer)?;
            bo.write_slice(0, &self.enc.buf)?;
            if !self.descs.is_empty() {
                bo.write_slice(self.cmd_cap, &self.descs)?;
            }
            self.dirty = false;
        }
        Ok((self.va, len as u32))
    }

    pub(crate) fn submitted(&mut self, fence: Fence) {
        self.last = Some(fence);
    }
}

impl Drop for CommandBuffer {
    fn drop(&mut self) {
        let Some(f) = self.last.take() else { return };
        // Unmapping the bytes under a running submission would fault the
        // queue: wait for it. If it is still running after the wait (a job
        // blocked for good), leak the buffer (it goes with the device
        // file) rather than pull it from under the device.
        if let Err(Error::Timeout { .. }) = f.wait(Duration::from_secs(10)) {
            std::mem::forget(self.bo.take());
        }
    }
}

fn aligned(what: &'static str, value: u64, align: u64) -> Result<()> {
    if value.is_multiple_of(align) {
        Ok(())
    } else {
        Err(Error::Misaligned { what, value, align })
    }
}

#[cfg(test)]
impl CommandBuffer {
    /// A command buffer for host tests whose bytes would live at `va`.
    pub(crate) fn fake(dev: &Device, va: u64, cmd_cap: u64, desc_cap: u64) -> CommandBuffer {
        CommandBuffer {
            dev: dev.inner.clone(),
            bo: None,
            va,
            cmd_cap,
            desc_cap,
            enc: Encoder::new(Vec::new()),
            descs: Vec::new(),
            dirty: true,
            last: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rbln_hw::cmd::Packet;

    fn packets(b: &[u8]) -> Vec<Packet> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < b.len() {
            let (p, n) = Packet::decode(&b[off..]).expect("well-formed packet");
            out.push(p);
            off += n;
        }
        out
    }

    #[test]
    fn descriptors_get_their_header() {
        let d = gemm_desc(3, 4, 5, 0x1000, 0x2000, 0x3000);
        let b = d.encode();
        assert_eq!(b.len(), ops::GemmDesc::SIZE);
        match ops::Desc::decode(&b) {
            Ok(ops::Desc::Gemm(g)) => {
                assert_eq!((g.m, g.n, g.k, g.batch), (3, 4, 5, 1));
                assert_eq!(g.header.op, ops::OpCode::Gemm as u32);
            }
            other => panic!("decoded {other:?}"),
        }
        let u = ops::UnaryDesc { kind: ops::Unary::Relu as u32, count: 4, ..Default::default() };
        assert!(matches!(ops::Desc::decode(&u.encode()), Ok(ops::Desc::Unary(_))));
    }

    #[test]
    fn builds_checked_commands_over_buffers() {
        let dev = Device::fake();
        let host = Buffer::fake(&dev, 1, 8192, Placement::Host, &[(0x20_0000, Perms::RW)]);
        let dram = Buffer::fake(&dev, 2, 1 << 20, Placement::Dram, &[(0x40_0000, Perms::RW)]);
        let mut cb = CommandBuffer::fake(&dev, 0x80_0000, 4096, 4096);
        cb.copy(&host, 16, &dram, 32, 100)
            .unwrap()
            .fill(&dram, 64, 256, 0xdead_beef)
            .unwrap()
            .timestamp(&host, 4096)
            .unwrap()
            .sem_wait(&host, 8, 1, SemCond::Ge)
            .unwrap()
            .sem_signal(&host, 8, 1, SemOp::Add)
            .unwrap()
            .gemm(2, 3, 4, (&dram, 0), (&dram, 1024), (&dram, 2048))
            .unwrap()
            .nop();
        let p = packets(cb.commands());
        assert_eq!(p.len(), 7);
        assert!(matches!(p[0], Packet::DmaCopy(cmd::DmaCopy { src_va: 0x20_0010, dst_va: 0x40_0020, size: 100, .. })));
        assert!(matches!(p[1], Packet::Fill(cmd::Fill { dst_va: 0x40_0040, size: 256, value: 0xdead_beef, .. })));
        assert!(matches!(p[2], Packet::Timestamp(cmd::Timestamp { addr_va: 0x20_1000, .. })));
        assert!(matches!(p[3], Packet::SemWait(cmd::SemWait { addr_va: 0x20_0008, value: 1, cond: cmd::SEM_COND_GE, .. })));
        assert!(matches!(p[4], Packet::SemSignal(cmd::SemSignal { op: cmd::SEM_OP_ADD, .. })));
        // The descriptor sits in the descriptor area, after the commands.
        let Packet::Compute(c) = p[5] else { panic!("{:?}", p[5]) };
        assert_eq!((c.desc_va, c.desc_size as usize), (0x80_0000 + 4096, ops::GemmDesc::SIZE));
        let Ok(ops::Desc::Gemm(g)) = ops::Desc::decode(&cb.descs[..ops::GemmDesc::SIZE]) else { panic!() };
        assert_eq!((g.m, g.n, g.k, g.a_va, g.b_va, g.c_va), (2, 3, 4, 0x40_0000, 0x40_0400, 0x40_0800));
        assert!(matches!(p[6], Packet::Nop { size_dwords: 1 }));
        // A second descriptor goes 8-byte aligned after the first.
        cb.compute_bytes(&[0u8; 12]).unwrap().compute_bytes(&[0u8; 8]).unwrap();
        let p = packets(cb.commands());
        let (Packet::Compute(a), Packet::Compute(b)) = (p[7], p[8]) else { panic!() };
        assert_eq!(a.desc_va, 0x80_0000 + 4096 + ops::GemmDesc::SIZE as u64);
        assert_eq!(b.desc_va, 0x80_0000 + 4096 + ops::GemmDesc::SIZE as u64 + 16);
        cb.reset();
        assert!(cb.is_empty());
    }

    #[test]
    fn mistakes_are_caught_before_the_device_sees_them() {
        let dev = Device::fake();
        let host = Buffer::fake(&dev, 1, 4096, Placement::Host, &[(0x20_0000, Perms::RW)]);
        let ro = Buffer::fake(&dev, 2, 4096, Placement::Host, &[(0x30_0000, Perms::READ)]);
        let unmapped = Buffer::fake(&dev, 3, 4096, Placement::Dram, &[]);
        let mut cb = CommandBuffer::fake(&dev, 0x80_0000, 4096, 128);
        let e = cb.copy(&host, 4000, &host, 0, 200).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { offset: 4000, len: 200, size: 4096, .. }), "{e}");
        assert_eq!(e.to_string(), "DMA copy source: bytes 4000..4200 lie outside the buffer of 4096 bytes");
        let e = cb.copy(&host, 0, &ro, 0, 16).unwrap_err();
        assert!(matches!(e, Error::PermissionMissing { handle: 2, needed: "WRITE", .. }), "{e}");
        assert!(e.to_string().contains("map it with Perms::WRITE"), "{e}");
        let e = cb.fill(&unmapped, 0, 16, 0).unwrap_err();
        assert!(matches!(e, Error::NotMapped { handle: 3 }), "{e}");
        assert!(e.to_string().contains("call Buffer::map first"), "{e}");
        assert!(matches!(cb.timestamp(&host, 4).unwrap_err(), Error::Misaligned { align: 8, .. }));
        assert!(matches!(cb.fill(&host, 2, 4, 0).unwrap_err(), Error::Misaligned { align: 4, .. }));
        assert!(matches!(cb.gemm(64, 64, 64, (&host, 0), (&host, 0), (&host, 0)).unwrap_err(), Error::OutOfBounds { .. }));
        // 128 bytes of descriptor room: one GEMM (104) fits, a second not.
        cb.gemm(1, 1, 1, (&host, 0), (&host, 4), (&host, 8)).unwrap();
        let e = cb.gemm(1, 1, 1, (&host, 0), (&host, 4), (&host, 8)).unwrap_err();
        assert!(matches!(e, Error::CommandBufferFull { need: 208, capacity: 128, .. }), "{e}");
        assert!(matches!(cb.compute_bytes(&[0; 6]).unwrap_err(), Error::InvalidInput(_)));
        // Buffers of another open device are refused.
        let other = Device::fake();
        let foreign = Buffer::fake(&other, 9, 4096, Placement::Host, &[(0x20_0000, Perms::RW)]);
        assert!(matches!(cb.copy(&foreign, 0, &host, 0, 4).unwrap_err(), Error::ForeignDevice { handle: 9 }));
        // Nothing invalid was encoded along the way.
        assert_eq!(packets(cb.commands()).len(), 1);
        // An empty command buffer is not submitted.
        let mut empty = CommandBuffer::fake(&dev, 0x80_0000, 4096, 128);
        assert!(matches!(empty.prepare().unwrap_err(), Error::EmptyCommandBuffer));
        // Commands beyond the command area are refused at submission.
        let mut small = CommandBuffer::fake(&dev, 0x80_0000, 8, 128);
        small.nop().nop().nop();
        assert!(matches!(small.prepare().unwrap_err(), Error::CommandBufferFull { need: 12, capacity: 8, .. }));
    }
}
