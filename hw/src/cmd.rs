//! Command packets: the command processor's instruction set.
//!
//! A command buffer is a sequence of packets, each a whole number of
//! little-endian dwords. Every packet starts with a header dword:
//! bits 7..0 opcode, bits 15..8 flags, bits 31..16 packet size in dwords
//! including the header. Each opcode has one fixed size (NOP: any size of
//! at least 1, so it can pad); a packet whose size, flags or reserved
//! fields do not match is rejected as a whole ([`DecodeError`]), never
//! guessed at.

/// Packet opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    Nop = 0x00,
    DmaCopy = 0x01,
    Fill = 0x02,
    Compute = 0x03,
    SemWait = 0x04,
    SemSignal = 0x05,
    Fence = 0x06,
    Timestamp = 0x07,
    Indirect = 0x08,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Option<Self> {
        use Opcode::*;
        Some(match v {
            0x00 => Nop,
            0x01 => DmaCopy,
            0x02 => Fill,
            0x03 => Compute,
            0x04 => SemWait,
            0x05 => SemSignal,
            0x06 => Fence,
            0x07 => Timestamp,
            0x08 => Indirect,
            _ => return None,
        })
    }
}

/// Largest transfer one DMA_COPY or FILL packet may ask for; larger sizes
/// are rejected as BadPacket. Bounds how long one packet can hold a DMA
/// engine (and how long stopping its queue can take).
pub const MAX_DMA_SIZE: u64 = 1 << 30;

/// Deepest nesting of INDIRECT packets (a ring entry's buffer is depth 0).
pub const MAX_INDIRECT_DEPTH: u32 = 4;

/// FENCE flag: raise the queue's fence interrupt after the write.
pub const FENCE_FLAG_IRQ: u8 = 1 << 0;

/// SEM_WAIT conditions.
pub const SEM_COND_EQ: u32 = 0;
/// Unsigned greater-or-equal.
pub const SEM_COND_GE: u32 = 1;
/// SEM_SIGNAL operations.
pub const SEM_OP_SET: u32 = 0;
pub const SEM_OP_ADD: u32 = 1;

/// Build a header dword.
pub const fn header(op: Opcode, flags: u8, size_dwords: u16) -> u32 {
    op as u32 | (flags as u32) << 8 | (size_dwords as u32) << 16
}

/// Split a header dword into (opcode byte, flags, size in dwords).
pub const fn split_header(h: u32) -> (u8, u8, u16) {
    (h as u8, (h >> 8) as u8, (h >> 16) as u16)
}

wire_struct! {
    /// DMA_COPY: copy `size` bytes from `src_va` to `dst_va`. Any
    /// alignment; overlapping ranges give an unspecified result.
    pub struct DmaCopy {
        pub header: u32,
        /// Reserved, must be 0.
        pub reserved: u32,
        pub src_va: u64,
        pub dst_va: u64,
        pub size: u64,
    }
}

wire_struct! {
    /// FILL: write the 32-bit `value` repeatedly over `size` bytes at
    /// `dst_va` (both 4-byte aligned).
    pub struct Fill {
        pub header: u32,
        pub value: u32,
        pub dst_va: u64,
        pub size: u64,
    }
}

wire_struct! {
    /// COMPUTE: run the compute descriptor of `desc_size` bytes at
    /// `desc_va` (4-byte aligned) on a compute core.
    pub struct Compute {
        pub header: u32,
        pub desc_size: u32,
        pub desc_va: u64,
    }
}

wire_struct! {
    /// SEM_WAIT: block the queue until the u64 at `addr_va` (8-byte
    /// aligned) satisfies `cond` against `value`.
    pub struct SemWait {
        pub header: u32,
        pub cond: u32,
        pub addr_va: u64,
        pub value: u64,
    }
}

wire_struct! {
    /// SEM_SIGNAL: set the u64 at `addr_va` to `value`, or add `value` to it.
    pub struct SemSignal {
        pub header: u32,
        pub op: u32,
        pub addr_va: u64,
        pub value: u64,
    }
}

wire_struct! {
    /// FENCE: after all earlier packets of the queue completed, set the
    /// queue's fence to `value`, write it to `addr_va` as a u64 when
    /// non-zero (8-byte aligned), update the status block, and raise the
    /// fence interrupt if flag [`FENCE_FLAG_IRQ`] is set.
    pub struct Fence {
        pub header: u32,
        /// Reserved, must be 0.
        pub reserved: u32,
        pub value: u64,
        pub addr_va: u64,
    }
}

wire_struct! {
    /// TIMESTAMP: write the device clock (u64 ns) to `addr_va` (8-byte
    /// aligned) once all earlier packets completed.
    pub struct Timestamp {
        pub header: u32,
        /// Reserved, must be 0.
        pub reserved: u32,
        pub addr_va: u64,
    }
}

wire_struct! {
    /// INDIRECT: execute the command buffer of `size` bytes at `va`, then
    /// continue after this packet.
    pub struct Indirect {
        pub header: u32,
        pub size: u32,
        pub va: u64,
    }
}

const _: () = assert!(DmaCopy::SIZE == 32);
const _: () = assert!(Fill::SIZE == 24);
const _: () = assert!(Compute::SIZE == 16);
const _: () = assert!(SemWait::SIZE == 24);
const _: () = assert!(SemSignal::SIZE == 24);
const _: () = assert!(Fence::SIZE == 24);
const _: () = assert!(Timestamp::SIZE == 16);
const _: () = assert!(Indirect::SIZE == 16);

/// Flags each opcode accepts (others must be zero).
const fn allowed_flags(op: Opcode) -> u8 {
    match op {
        Opcode::Fence => FENCE_FLAG_IRQ,
        _ => 0,
    }
}

/// A decoded packet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Packet {
    Nop { size_dwords: u16 },
    DmaCopy(DmaCopy),
    Fill(Fill),
    Compute(Compute),
    SemWait(SemWait),
    SemSignal(SemSignal),
    Fence(Fence),
    Timestamp(Timestamp),
    Indirect(Indirect),
}

/// Why a packet was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer than 4 bytes left, or the packet runs past the buffer's end.
    Truncated,
    /// Size field is 0 or does not match the opcode's size.
    BadSize,
    UnknownOpcode(u8),
    /// Flags outside the opcode's allowed set.
    BadFlags,
    /// A field has an invalid value (condition, operation, alignment).
    BadField,
}

impl Packet {
    /// Decode the packet at the start of `buf`. Returns it and its size in
    /// bytes.
    pub fn decode(buf: &[u8]) -> Result<(Packet, usize), DecodeError> {
        let h = buf.get(..4).map(<u32 as super::Wire>::get).ok_or(DecodeError::Truncated)?;
        let (op, flags, size) = split_header(h);
        let op = Opcode::from_u8(op).ok_or(DecodeError::UnknownOpcode(op))?;
        if size == 0 {
            return Err(DecodeError::BadSize);
        }
        let bytes = size as usize * 4;
        let body = buf.get(..bytes).ok_or(DecodeError::Truncated)?;
        if flags & !allowed_flags(op) != 0 {
            return Err(DecodeError::BadFlags);
        }
        macro_rules! fixed {
            ($t:ident) => {{
                if bytes != $t::SIZE {
                    return Err(DecodeError::BadSize);
                }
                // Length checked just above.
                $t::read_from(body).ok_or(DecodeError::Truncated)?
            }};
        }
        let p = match op {
            Opcode::Nop => Packet::Nop { size_dwords: size },
            Opcode::DmaCopy => {
                let p = fixed!(DmaCopy);
                if p.reserved != 0 || p.size > MAX_DMA_SIZE {
                    return Err(DecodeError::BadField);
                }
                Packet::DmaCopy(p)
            }
            Opcode::Fill => {
                let p = fixed!(Fill);
                if p.dst_va % 4 != 0 || p.size % 4 != 0 || p.size > MAX_DMA_SIZE {
                    return Err(DecodeError::BadField);
                }
                Packet::Fill(p)
            }
            Opcode::Compute => {
                let p = fixed!(Compute);
                if p.desc_va % 4 != 0 {
                    return Err(DecodeError::BadField);
                }
                Packet::Compute(p)
            }
            Opcode::SemWait => {
                let p = fixed!(SemWait);
                if p.addr_va % 8 != 0 || p.cond > SEM_COND_GE {
                    return Err(DecodeError::BadField);
                }
                Packet::SemWait(p)
            }
            Opcode::SemSignal => {
                let p = fixed!(SemSignal);
                if p.addr_va % 8 != 0 || p.op > SEM_OP_ADD {
                    return Err(DecodeError::BadField);
                }
                Packet::SemSignal(p)
            }
            Opcode::Fence => {
                let p = fixed!(Fence);
                if p.addr_va % 8 != 0 || p.reserved != 0 {
                    return Err(DecodeError::BadField);
                }
                Packet::Fence(p)
            }
            Opcode::Timestamp => {
                let p = fixed!(Timestamp);
                if p.addr_va % 8 != 0 || p.reserved != 0 {
                    return Err(DecodeError::BadField);
                }
                Packet::Timestamp(p)
            }
            Opcode::Indirect => {
                let p = fixed!(Indirect);
                if p.va % 4 != 0 || p.size % 4 != 0 || p.size > super::ring::MAX_CMDBUF_SIZE {
                    return Err(DecodeError::BadField);
                }
                Packet::Indirect(p)
            }
        };
        Ok((p, bytes))
    }
}

/// Builds command buffers. Every method appends one well-formed packet;
/// `finish` returns the bytes. Used by the UMD's typed builder, the KMD
/// and the tests.
#[derive(Default)]
pub struct Encoder<B: Extend<u8> + AsRef<[u8]>> {
    pub buf: B,
}

macro_rules! size_dw {
    ($t:ident) => {
        ($t::SIZE / 4) as u16
    };
}

impl<B: Extend<u8> + AsRef<[u8]>> Encoder<B> {
    pub fn new(buf: B) -> Self {
        Self { buf }
    }

    /// Bytes encoded so far.
    pub fn len(&self) -> usize {
        self.buf.as_ref().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push<const N: usize>(&mut self, bytes: [u8; N]) -> &mut Self {
        self.buf.extend(bytes);
        self
    }

    pub fn nop(&mut self) -> &mut Self {
        self.push(header(Opcode::Nop, 0, 1).to_le_bytes())
    }

    pub fn dma_copy(&mut self, src_va: u64, dst_va: u64, size: u64) -> &mut Self {
        let header = header(Opcode::DmaCopy, 0, size_dw!(DmaCopy));
        self.push(DmaCopy { header, reserved: 0, src_va, dst_va, size }.to_bytes())
    }

    pub fn fill(&mut self, dst_va: u64, size: u64, value: u32) -> &mut Self {
        let header = header(Opcode::Fill, 0, size_dw!(Fill));
        self.push(Fill { header, dst_va, size, value }.to_bytes())
    }

    pub fn compute(&mut self, desc_va: u64, desc_size: u32) -> &mut Self {
        let header = header(Opcode::Compute, 0, size_dw!(Compute));
        self.push(Compute { header, desc_va, desc_size }.to_bytes())
    }

    pub fn sem_wait(&mut self, addr_va: u64, value: u64, cond: u32) -> &mut Self {
        let header = header(Opcode::SemWait, 0, size_dw!(SemWait));
        self.push(SemWait { header, addr_va, value, cond }.to_bytes())
    }

    pub fn sem_signal(&mut self, addr_va: u64, value: u64, op: u32) -> &mut Self {
        let header = header(Opcode::SemSignal, 0, size_dw!(SemSignal));
        self.push(SemSignal { header, addr_va, value, op }.to_bytes())
    }

    pub fn fence(&mut self, value: u64, addr_va: u64, irq: bool) -> &mut Self {
        let flags = if irq { FENCE_FLAG_IRQ } else { 0 };
        let header = header(Opcode::Fence, flags, size_dw!(Fence));
        self.push(Fence { header, reserved: 0, value, addr_va }.to_bytes())
    }

    pub fn timestamp(&mut self, addr_va: u64) -> &mut Self {
        let header = header(Opcode::Timestamp, 0, size_dw!(Timestamp));
        self.push(Timestamp { header, reserved: 0, addr_va }.to_bytes())
    }

    pub fn indirect(&mut self, va: u64, size: u32) -> &mut Self {
        let header = header(Opcode::Indirect, 0, size_dw!(Indirect));
        self.push(Indirect { header, va, size }.to_bytes())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    #[test]
    fn encode_decode_round_trip() {
        let mut e = Encoder::new(Vec::new());
        e.nop()
            .dma_copy(0x1000, 0x2000, 77)
            .fill(0x3000, 64, 0xdead_beef)
            .compute(0x4000, 128)
            .sem_wait(0x5000, 3, SEM_COND_GE)
            .sem_signal(0x5000, 1, SEM_OP_ADD)
            .fence(42, 0x6000, true)
            .timestamp(0x7000)
            .indirect(0x8000, 64);
        let buf = e.buf;
        let mut off = 0;
        let mut got = Vec::new();
        while off < buf.len() {
            let (p, n) = Packet::decode(&buf[off..]).unwrap();
            got.push(p);
            off += n;
        }
        assert_eq!(got.len(), 9);
        assert!(matches!(got[1], Packet::DmaCopy(DmaCopy { src_va: 0x1000, dst_va: 0x2000, size: 77, .. })));
        assert!(matches!(got[6], Packet::Fence(Fence { value: 42, addr_va: 0x6000, .. })));
        let (_, flags, _) = split_header(match got[6] {
            Packet::Fence(f) => f.header,
            _ => unreachable!(),
        });
        assert_eq!(flags, FENCE_FLAG_IRQ);
    }

    #[test]
    fn rejects_bad_packets() {
        assert_eq!(Packet::decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(Packet::decode(&0x0000_00ffu32.to_le_bytes()), Err(DecodeError::UnknownOpcode(0xff)));
        assert_eq!(Packet::decode(&header(Opcode::Nop, 0, 0).to_le_bytes()), Err(DecodeError::BadSize));
        assert_eq!(Packet::decode(&header(Opcode::Nop, 0, 2).to_le_bytes()), Err(DecodeError::Truncated));
        assert_eq!(Packet::decode(&header(Opcode::Nop, 1, 1).to_le_bytes()), Err(DecodeError::BadFlags));
        let mut b = [0u8; 64];
        b[..4].copy_from_slice(&header(Opcode::Timestamp, 0, 3).to_le_bytes());
        assert_eq!(Packet::decode(&b), Err(DecodeError::BadSize));
        let mut e = Encoder::new(Vec::new());
        e.sem_wait(0x5004, 1, SEM_COND_EQ);
        assert_eq!(Packet::decode(&e.buf), Err(DecodeError::BadField));
    }
}
