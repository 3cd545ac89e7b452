//! Device MMU: three-level page tables of 4 KiB pages, one per context.
//!
//! A device virtual address has 39 significant bits:
//! `[38:30]` level-2 index, `[29:21]` level-1 index, `[20:12]` level-0
//! index, `[11:0]` page offset. Bits 63..39 must be zero. Each table is a
//! 4 KiB page of 512 little-endian u64 entries in host memory (bus
//! addresses), the level-2 table of a context being `CTX_PT_ROOT`.

/// Number of VA bits the MMU translates.
pub const VA_BITS: u32 = 39;
/// One past the highest valid device virtual address.
pub const VA_LIMIT: u64 = 1 << VA_BITS;
pub const ENTRIES_PER_TABLE: usize = 512;
pub const LEVELS: u32 = 3;

/// Entry is valid. Table entries (levels 2 and 1) need only this bit.
pub const PTE_VALID: u64 = 1 << 0;
/// Leaf: page readable.
pub const PTE_READ: u64 = 1 << 1;
/// Leaf: page writable.
pub const PTE_WRITE: u64 = 1 << 2;
/// Leaf: the address is an offset into device DRAM, not a host bus address.
pub const PTE_DRAM: u64 = 1 << 3;
/// Bits 51..12: page (or next table) address.
pub const PTE_ADDR_MASK: u64 = 0x000F_FFFF_FFFF_F000;
/// Bits that must be zero in a leaf entry.
pub const PTE_LEAF_RESERVED: u64 = !(PTE_ADDR_MASK | PTE_VALID | PTE_READ | PTE_WRITE | PTE_DRAM);
/// Bits that must be zero in a table entry.
pub const PTE_TABLE_RESERVED: u64 = !(PTE_ADDR_MASK | PTE_VALID);

/// Index into the table of `level` (2, 1 or 0) for `va`.
pub const fn va_index(va: u64, level: u32) -> usize {
    ((va >> (12 + 9 * level)) & 0x1FF) as usize
}

/// A leaf entry mapping a page.
pub const fn leaf_pte(addr: u64, target: Target, read: bool, write: bool) -> u64 {
    (addr & PTE_ADDR_MASK)
        | PTE_VALID
        | if read { PTE_READ } else { 0 }
        | if write { PTE_WRITE } else { 0 }
        | match target {
            Target::Host => 0,
            Target::Dram => PTE_DRAM,
        }
}

/// A table entry pointing at the next-level table at bus address `addr`.
pub const fn table_pte(addr: u64) -> u64 {
    (addr & PTE_ADDR_MASK) | PTE_VALID
}

/// Where a leaf entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Host (guest) memory, by bus address.
    Host,
    /// Device DRAM, by offset from the start of BAR2.
    Dram,
}

/// Decoded leaf entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub addr: u64,
    pub target: Target,
    pub read: bool,
    pub write: bool,
}

/// Why an entry does not translate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PteError {
    /// VALID is clear.
    NotValid,
    /// Reserved bits are set.
    Reserved,
}

pub fn decode_leaf(pte: u64) -> Result<Leaf, PteError> {
    if pte & PTE_VALID == 0 {
        return Err(PteError::NotValid);
    }
    if pte & PTE_LEAF_RESERVED != 0 {
        return Err(PteError::Reserved);
    }
    Ok(Leaf {
        addr: pte & PTE_ADDR_MASK,
        target: if pte & PTE_DRAM != 0 { Target::Dram } else { Target::Host },
        read: pte & PTE_READ != 0,
        write: pte & PTE_WRITE != 0,
    })
}

/// Bus address of the next-level table.
pub fn decode_table(pte: u64) -> Result<u64, PteError> {
    if pte & PTE_VALID == 0 {
        return Err(PteError::NotValid);
    }
    if pte & PTE_TABLE_RESERVED != 0 {
        return Err(PteError::Reserved);
    }
    Ok(pte & PTE_ADDR_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_round_trip() {
        let pte = leaf_pte(0x1234_5000, Target::Dram, true, false);
        let l = decode_leaf(pte).unwrap();
        assert_eq!(l, Leaf { addr: 0x1234_5000, target: Target::Dram, read: true, write: false });
        assert_eq!(decode_leaf(pte | 1 << 60), Err(PteError::Reserved));
        assert_eq!(decode_leaf(0), Err(PteError::NotValid));
        assert_eq!(decode_table(pte), Err(PteError::Reserved));
        assert_eq!(decode_table(table_pte(0x8000)), Ok(0x8000));
    }

    #[test]
    fn va_split() {
        let va = (3u64 << 30) | (5 << 21) | (7 << 12) | 0x123;
        assert_eq!((va_index(va, 2), va_index(va, 1), va_index(va, 0)), (3, 5, 7));
    }
}
