//! Compute descriptors → kernels. Placeholder until the kernels land.

use rbln_hw::ring::{Access, FaultCode};

use crate::mmu::{AddressSpace, Fault};

/// Largest descriptor a COMPUTE packet may name.
pub const MAX_DESC_SIZE: usize = 4096;

/// Run the descriptor; returns its nominal FLOP count.
pub fn run(_mem: &mut AddressSpace<'_>, _desc: &[u8], desc_va: u64) -> Result<u64, Fault> {
    Err(Fault::new(FaultCode::BadDescriptor, Access::Read, desc_va))
}
