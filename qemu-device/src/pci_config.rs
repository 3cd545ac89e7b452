//! PCI configuration space of the NPU (type-0 header + MSI-X capability).

use rbln_hw::pci;
use rbln_hw::regs::MSIX_VECTORS;

pub const CONFIG_SIZE: usize = 256;
const MSIX_CAP: usize = 0x40;
/// Command register bits software may set: I/O, memory, bus master,
/// parity/SERR reporting, INTx disable.
const COMMAND_WRITABLE: u16 = 0x0547;

/// BAR `i`: (size, low type bits), or None when unused. 64-bit BARs take
/// two slots; the second is the high half.
fn bar_layout(dram_size: u64, doorbell_size: u64) -> [Option<(u64, u32)>; 6] {
    const MEM64: u32 = 0b100;
    const PREFETCH: u32 = 0b1000;
    [
        Some((pci::BAR_REGS_SIZE, 0)),
        None,
        Some((dram_size, MEM64 | PREFETCH)),
        None,
        Some((doorbell_size, MEM64)),
        None,
    ]
}

pub struct PciConfig {
    bytes: [u8; CONFIG_SIZE],
    bar_sizes: [u64; 6],
    bar_types: [u32; 6],
}

impl PciConfig {
    pub fn new(dram_size: u64, doorbell_size: u64) -> Self {
        let mut c = Self { bytes: [0; CONFIG_SIZE], bar_sizes: [0; 6], bar_types: [0; 6] };
        c.put16(0x00, pci::VENDOR_ID);
        c.put16(0x02, pci::DEVICE_ID);
        c.put16(0x06, 1 << 4); // status: capabilities list
        c.put32(0x08, pci::CLASS_CODE << 8 | pci::REVISION as u32);
        c.put16(0x2C, pci::SUBSYSTEM_VENDOR_ID);
        c.put16(0x2E, pci::SUBSYSTEM_ID);
        c.bytes[0x34] = MSIX_CAP as u8;
        // No INTx: interrupt pin 0. The device signals through MSI-X only.
        for (i, bar) in bar_layout(dram_size, doorbell_size).iter().enumerate() {
            if let Some((size, ty)) = *bar {
                c.bar_sizes[i] = size;
                c.bar_types[i] = ty;
                c.put32(0x10 + 4 * i, ty);
            }
        }
        // MSI-X capability: table and PBA in BAR0.
        c.bytes[MSIX_CAP] = 0x11;
        c.bytes[MSIX_CAP + 1] = 0; // end of list
        c.put16(MSIX_CAP + 2, (MSIX_VECTORS - 1) as u16);
        c.put32(MSIX_CAP + 4, pci::MSIX_TABLE_OFFSET | pci::BAR_REGS);
        c.put32(MSIX_CAP + 8, pci::MSIX_PBA_OFFSET | pci::BAR_REGS);
        c
    }

    fn put16(&mut self, off: usize, v: u16) {
        self.bytes[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, off: usize, v: u32) {
        self.bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn get32(&self, off: usize) -> u32 {
        u32::from_le_bytes([self.bytes[off], self.bytes[off + 1], self.bytes[off + 2], self.bytes[off + 3]])
    }

    pub fn read(&self, off: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = off
                .checked_add(i as u64)
                .and_then(|o| self.bytes.get(o as usize))
                .copied()
                .unwrap_or(0xFF);
        }
    }

    pub fn write(&mut self, off: u64, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            if let Some(o) = off.checked_add(i as u64).map(|o| o as usize) {
                self.write_byte(o, b);
            }
        }
        // Re-apply BAR size masks after any write to the BAR block.
        for i in 0..6 {
            self.fix_bar(i);
        }
    }

    fn write_byte(&mut self, o: usize, b: u8) {
        let writable: u8 = match o {
            0x04 => COMMAND_WRITABLE as u8,
            0x05 => (COMMAND_WRITABLE >> 8) as u8,
            0x0C | 0x0D | 0x3C => 0xFF,
            0x10..=0x27 => 0xFF, // BARs, masked by fix_bar
            o if o == MSIX_CAP + 3 => 0xC0, // MSI-X enable + function mask
            _ => 0,
        };
        if o < CONFIG_SIZE {
            self.bytes[o] = (self.bytes[o] & !writable) | (b & writable);
        }
    }

    /// Force BAR `i` to its size alignment and type bits (BAR sizing:
    /// software writes all ones and reads back the size mask).
    fn fix_bar(&mut self, i: usize) {
        let off = 0x10 + 4 * i;
        let v = self.get32(off);
        let is_high = i > 0 && self.bar_types[i - 1] & 0b100 != 0 && self.bar_sizes[i - 1] != 0;
        let fixed = if is_high {
            let size = self.bar_sizes[i - 1];
            v & (!(size - 1) >> 32) as u32
        } else if self.bar_sizes[i] != 0 {
            let size = self.bar_sizes[i];
            (v & !(size - 1) as u32 & !0xF) | self.bar_types[i]
        } else {
            0
        };
        self.put32(off, fixed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_and_bar_sizing() {
        let mut c = PciConfig::new(256 << 20, 64 << 10);
        let mut b = [0u8; 4];
        c.read(0, &mut b);
        assert_eq!(u32::from_le_bytes(b), (pci::DEVICE_ID as u32) << 16 | pci::VENDOR_ID as u32);
        c.read(0x08, &mut b);
        assert_eq!(u32::from_le_bytes(b) >> 8, 0x120000);
        c.write(0x18, &[0xFF; 4]);
        c.write(0x1C, &[0xFF; 4]);
        c.read(0x18, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xF000_000C); // 256 MiB, 64-bit prefetchable
        c.read(0x1C, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xFFFF_FFFF);
        c.write(0x10, &[0xFF; 4]);
        c.read(0x10, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xFFFF_0000);
        c.write(0x14, &[0xFF; 4]);
        c.read(0x14, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0);
        c.write(0x00, &[0, 0, 0, 0]);
        c.read(0, &mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), pci::VENDOR_ID, "IDs are read-only");
    }
}
