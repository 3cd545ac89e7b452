//! `rbln_umd`: the user-mode driver of the rbln NPU (`librbln_umd`).
//!
//! It sits on `/dev/rblnN` (the `rbln.ko` uAPI, crate `rbln-uapi`) and the
//! hardware contract (crate `rbln-hw`) and gives programs:
//!
//! - [`Device`]: an open NPU (one device context: address space, buffers,
//!   queues), [`Device::info`].
//! - [`Buffer`]: memory in device DRAM or host memory
//!   ([`Device::alloc`]), mapped into the device VA space with
//!   [`Buffer::map`]; host buffers have a typed CPU view
//!   ([`Buffer::write_slice`], [`Buffer::read_vec`]).
//! - [`CommandBuffer`]: a typed builder of command packets (DMA copy,
//!   fill, compute descriptors such as GEMM, semaphores, timestamps,
//!   indirect calls) whose bytes live in a host buffer the device reads.
//! - Queues, two kinds: [`Queue`] submits through the kernel
//!   (`RBLN_IOCTL_SUBMIT`, one system call per submission), and
//!   [`UserQueue`] ([`Queue::into_user_mode`]) writes its mapped ring and
//!   rings its own doorbell page, with no system call. Once a queue's ring
//!   or doorbell is mapped the kernel refuses `SUBMIT` on it, so the types
//!   make a queue one kind or the other, never both.
//! - [`Fence`]: completion of a submission; [`Fence::wait`] sleeps in the
//!   kernel (fence interrupt), [`Fence::poll`] and [`Fence::spin_wait`]
//!   read the queue's status block.
//! - [`Error`]: what went wrong and what to do, errnos mapped per ioctl.
//!
//! A C ABI with the same model is in [`capi`] (header
//! `umd/include/rbln_umd.h`, pkg-config `rbln_umd`).
//!
//! # Example
//!
//! ```no_run
//! use rbln_umd::{Device, Placement, Perms, CommandBuffer};
//! use std::time::Duration;
//!
//! let dev = Device::open(0)?;
//! let host = dev.alloc(4096, Placement::Host)?;
//! let dram = dev.alloc(4096, Placement::Dram)?;
//! host.map(Perms::RW)?;
//! dram.map(Perms::RW)?;
//! host.write_slice(0, &[1.0f32, 2.0, 3.0, 4.0])?;
//! let mut cb = CommandBuffer::new(&dev)?;
//! cb.copy(&host, 0, &dram, 0, 16)?.copy(&dram, 0, &host, 1024, 16)?;
//! let mut queue = dev.create_user_queue(0)?;
//! queue.submit(&mut cb)?.wait(Duration::from_secs(5))?;
//! assert_eq!(host.read_vec::<f32>(1024, 4)?, [1.0, 2.0, 3.0, 4.0]);
//! # Ok::<(), rbln_umd::Error>(())
//! ```
//!
//! # Threads
//!
//! [`Device`], [`Buffer`] and [`Fence`] are `Send + Sync`: share a device
//! (clone it, or borrow it in scoped threads) and its buffers between
//! threads. [`Queue`], [`UserQueue`] and [`CommandBuffer`] are `Send` but
//! not `Sync`: give each thread its own queue (the hardware has 16 or more;
//! queues of one device run concurrently) and its own command buffers. All
//! queues of one `Device` share its device context: a fault on any of them
//! poisons the context, and every later submission fails with
//! [`Error::Poisoned`] until the device is reopened.
//!
//! # Lifetimes
//!
//! Everything made from a `Device` keeps its file (context) open. Dropping
//! a buffer unmaps and frees it at once, even if queued work still uses it
//! (that work then faults): keep buffers alive until their fences signal.
//! Dropping a queue destroys it and abandons its pending work; its fences
//! then fail with [`Error::NotFound`]. Dropping a command buffer waits for
//! its last submission.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

mod buffer;
pub mod capi;
pub mod clock;
mod cmdbuf;
mod device;
mod error;
mod queue;
mod sys;

pub use buffer::{Buffer, Perms, Placement};
pub use cmdbuf::{
    gemm_desc, CommandBuffer, Descriptor, SemCond, SemOp, DEFAULT_COMMAND_BYTES, DEFAULT_DESCRIPTOR_BYTES,
    MAX_DESC_SIZE,
};
pub use device::{device_indices, node_of, nodes_in, physical_index, present_nodes, read_sysfs, reset_device, sysfs_path, usable_device_indices, Device, DeviceInfo, VISIBLE_DEVICES_ENV};
pub use error::{Error, FaultInfo, Op, Result};
pub use queue::{Fence, Queue, Submit, UserQueue, DEFAULT_RING_ENTRIES};

/// The contract crates, for descriptors ([`hw::ops`]) and constants.
pub use rbln_hw as hw;
pub use rbln_uapi as uapi;
/// For [`Buffer::write_slice`] and friends (`T: bytemuck::Pod`).
pub use bytemuck;
pub use nix::errno::Errno;

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn thread_safety_is_as_documented() {
        assert_send_sync::<Device>();
        assert_send_sync::<Buffer>();
        assert_send_sync::<Fence>();
        assert_send_sync::<Error>();
        assert_send::<Queue>();
        assert_send::<UserQueue>();
        assert_send::<CommandBuffer>();
    }
}
