//! The primitive encodings of the structured sections: little-endian
//! integers, length-prefixed UTF-8 strings, count-prefixed lists.
//!
//! The decoder checks every length and count against the bytes that are
//! actually left before it allocates anything, so a claimed size can never
//! make it allocate more than the section holds.

use crate::error::{FormatError, Result};

/// Builds a field name only when an error needs it.
macro_rules! field {
    ($($t:tt)*) => {
        &|| format!($($t)*)
    };
}
pub(crate) use field;

pub(crate) type Field<'f> = &'f dyn Fn() -> String;

/// A bounds-checked reader over one section's bytes.
pub(crate) struct Dec<'a> {
    section: &'a str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    pub fn new(section: &'a str, buf: &'a [u8]) -> Self {
        Self { section, buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    pub fn take(&mut self, n: usize, field: Field) -> Result<&'a [u8]> {
        let avail = self.remaining();
        if n > avail {
            return Err(FormatError::SectionTruncated {
                section: self.section.to_string(),
                field: field(),
                offset: self.pos as u64,
                needed: n as u64,
                available: avail as u64,
            });
        }
        let s = self.buf.get(self.pos..self.pos + n).unwrap_or_default();
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: Field) -> Result<[u8; N]> {
        let s = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self, field: Field) -> Result<u8> {
        Ok(self.array::<1>(field)?[0])
    }
    pub fn u16(&mut self, field: Field) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    pub fn u32(&mut self, field: Field) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    pub fn u64(&mut self, field: Field) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    pub fn bytes<const N: usize>(&mut self, field: Field) -> Result<[u8; N]> {
        self.array(field)
    }

    /// A u64 that must not exceed `limit`.
    pub fn u64_max(&mut self, limit: u64, field: Field) -> Result<u64> {
        let v = self.u64(field)?;
        if v > limit {
            return Err(self.limit(field, v, limit));
        }
        Ok(v)
    }

    pub fn limit(&self, field: Field, found: u64, limit: u64) -> FormatError {
        FormatError::LimitExceeded { section: self.section.to_string(), field: field(), found, limit }
    }

    /// A zero (reserved) field of the given width.
    pub fn reserved(&mut self, width: usize, field: Field) -> Result<()> {
        let v = match width {
            1 => self.u8(field)? as u64,
            2 => self.u16(field)? as u64,
            4 => self.u32(field)? as u64,
            _ => self.u64(field)?,
        };
        if v != 0 {
            return Err(FormatError::BadField {
                section: self.section.to_string(),
                field: field(),
                expected: "0 (reserved)".into(),
                found: v.to_string(),
            });
        }
        Ok(())
    }

    /// `str`: u32 byte length, then that many bytes of UTF-8.
    pub fn str(&mut self, max: u64, field: Field) -> Result<String> {
        let len = self.u32(field)? as u64;
        if len > max {
            return Err(self.limit(&|| format!("{} length", field()), len, max));
        }
        let b = self.take(len as usize, field)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(FormatError::InvalidUtf8 { section: self.section.to_string(), field: field() }),
        }
    }

    /// A list count: u32, at most `limit`, and `count * min_size` must fit
    /// in the remaining bytes (every element encodes to at least
    /// `min_size` bytes), so the caller may allocate `count` elements.
    pub fn count(&mut self, min_size: u64, limit: u64, field: Field) -> Result<usize> {
        let n = self.u32(field)? as u64;
        if n > limit {
            return Err(self.limit(&|| format!("{} count", field()), n, limit));
        }
        let needed = n.saturating_mul(min_size);
        let avail = self.remaining() as u64;
        if needed > avail {
            return Err(FormatError::CountExceedsData {
                section: self.section.to_string(),
                field: field(),
                count: n,
                needed,
                available: avail,
            });
        }
        Ok(n as usize)
    }

    /// `shape`: u32 rank (at most MAX_RANK), then rank u64 dims.
    pub fn shape(&mut self, field: Field) -> Result<Vec<u64>> {
        let rank = self.count(8, crate::limits::MAX_RANK, &|| format!("{} rank", field()))?;
        let mut dims = Vec::with_capacity(rank);
        for i in 0..rank {
            dims.push(self.u64(&|| format!("{} dim {i}", field()))?);
        }
        Ok(dims)
    }

    /// The section must be consumed exactly.
    pub fn finish(&self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(FormatError::TrailingBytes {
                section: self.section.to_string(),
                offset: self.pos as u64,
                count: self.remaining() as u64,
            });
        }
        Ok(())
    }

    pub fn unknown(&self, field: Field, value: u64) -> FormatError {
        FormatError::UnknownValue { section: self.section.to_string(), field: field(), value }
    }

    pub fn bad(&self, field: Field, expected: impl Into<String>, found: impl ToString) -> FormatError {
        FormatError::BadField {
            section: self.section.to_string(),
            field: field(),
            expected: expected.into(),
            found: found.to_string(),
        }
    }
}

/// The encoder: appends the same primitives. Lengths that do not fit their
/// u32 prefix are clamped (never a panic); the validator rejects such
/// models before a checked write.
#[derive(Default)]
pub(crate) struct Enc {
    pub buf: Vec<u8>,
}

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX))
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.count(s.len());
        self.raw(s.as_bytes())
    }
    pub fn shape(&mut self, dims: &[u64]) -> &mut Self {
        self.count(dims.len());
        for &d in dims {
            self.u64(d);
        }
        self
    }
}
