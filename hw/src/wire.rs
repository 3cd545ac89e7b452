//! Little-endian wire encoding of the fixed-layout structures.
//!
//! `wire_struct!` declares a `#[repr(C)]` struct whose fields are laid out
//! back to back with no padding (asserted at compile time), so the byte
//! encoding produced by `write_to`/`read_from` is exactly the in-memory
//! layout on a little-endian machine: the kernel can use the same struct
//! directly on shared memory.

/// A fixed-size value with a little-endian encoding.
pub trait Wire: Sized + Copy {
    const SIZE: usize;
    /// Decode from the first `SIZE` bytes of `b` (caller checks the length).
    fn get(b: &[u8]) -> Self;
    /// Encode into the first `SIZE` bytes of `b` (caller checks the length).
    fn put(&self, b: &mut [u8]);
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            fn get(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::SIZE]);
                <$t>::from_le_bytes(a)
            }
            fn put(&self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
wire_int!(u8, u16, u32, u64, i32, i64, f32);

impl<T: Wire + Default, const N: usize> Wire for [T; N] {
    const SIZE: usize = T::SIZE * N;
    fn get(b: &[u8]) -> Self {
        let mut out = [T::default(); N];
        for (i, v) in out.iter_mut().enumerate() {
            *v = T::get(&b[i * T::SIZE..]);
        }
        out
    }
    fn put(&self, b: &mut [u8]) {
        for (i, v) in self.iter().enumerate() {
            v.put(&mut b[i * T::SIZE..]);
        }
    }
}

/// Declare a packed-by-construction wire struct (see the module docs).
/// Used from the crate's top-level modules, hence `super::wire`.
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        // No implicit padding: the fields fill the struct exactly, so the
        // sequential encoding below equals the repr(C) layout.
        const _: () = assert!(
            0 $(+ core::mem::size_of::<$ty>())* == core::mem::size_of::<$name>()
        );

        impl $name {
            /// Encoded size in bytes.
            pub const SIZE: usize = core::mem::size_of::<$name>();

            /// Decode from the start of `b`; `None` if `b` is too short.
            pub fn read_from(b: &[u8]) -> Option<Self> {
                if b.len() < Self::SIZE {
                    return None;
                }
                let mut _off = 0usize;
                $(
                    let $field = <$ty as super::wire::Wire>::get(&b[_off..]);
                    _off += <$ty as super::wire::Wire>::SIZE;
                )*
                Some(Self { $($field),* })
            }

            /// Encode into the start of `b`; `None` if `b` is too short.
            pub fn write_to(&self, b: &mut [u8]) -> Option<()> {
                if b.len() < Self::SIZE {
                    return None;
                }
                let mut _off = 0usize;
                $(
                    super::wire::Wire::put(&self.$field, &mut b[_off..]);
                    _off += <$ty as super::wire::Wire>::SIZE;
                )*
                Some(())
            }

            /// The encoding as a fixed-size array.
            #[allow(clippy::wrong_self_convention)]
            pub fn to_bytes(&self) -> [u8; core::mem::size_of::<$name>()] {
                let mut b = [0u8; core::mem::size_of::<$name>()];
                // Cannot fail: the buffer has exactly SIZE bytes.
                let _ = self.write_to(&mut b);
                b
            }
        }

        impl super::wire::Wire for $name {
            const SIZE: usize = core::mem::size_of::<$name>();
            fn get(b: &[u8]) -> Self {
                // Callers pass at least SIZE bytes.
                Self::read_from(b).unwrap_or_default()
            }
            fn put(&self, b: &mut [u8]) {
                let _ = self.write_to(b);
            }
        }
    };
}
