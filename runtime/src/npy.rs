//! `.npy` files in and out (C order): float32, int32, int64, int8, uint8
//! and bool.

use std::path::Path;

use npyz::{TypeChar, WriterBuilder};

use crate::{Data, Tensor};

/// Read a tensor from a `.npy` file.
pub fn read(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| format!("{}: not a .npy file: {e}", path.display()))?;
    if npy.order() != npyz::Order::C {
        return Err(format!("{}: Fortran-order arrays are not supported; save it in C order", path.display()));
    }
    let shape = npy.shape().to_vec();
    let unsupported = || {
        format!(
            "{}: dtype {} is not supported (float32, int32, int64, int8, uint8 or bool; convert with numpy's astype)",
            path.display(),
            npy.dtype().descr()
        )
    };
    let kind = match npy.dtype() {
        npyz::DType::Plain(t) => (t.type_char(), t.size_field()),
        _ => return Err(unsupported()),
    };
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let data = match kind {
        (TypeChar::Float, 4) => Data::F32(npy.into_vec::<f32>().map_err(err)?),
        (TypeChar::Int, 4) => Data::I32(npy.into_vec::<i32>().map_err(err)?),
        (TypeChar::Int, 8) => Data::I64(npy.into_vec::<i64>().map_err(err)?),
        (TypeChar::Int, 1) => Data::I8(npy.into_vec::<i8>().map_err(err)?),
        (TypeChar::Uint, 1) => Data::U8(npy.into_vec::<u8>().map_err(err)?),
        (TypeChar::Bool, 1) => Data::Bool(npy.into_vec::<bool>().map_err(err)?),
        _ => return Err(unsupported()),
    };
    Ok(Tensor { shape, data })
}

/// Write a tensor to a `.npy` file.
pub fn write(path: &Path, t: &Tensor) -> Result<(), String> {
    fn put<T: npyz::Serialize + npyz::AutoSerialize + Copy>(shape: &[u64], v: &[T]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut w = npyz::WriteOptions::new().default_dtype().shape(shape).writer(&mut out).begin_nd()?;
        w.extend(v.iter().copied())?;
        w.finish()?;
        Ok(out)
    }
    let out = match &t.data {
        Data::F32(v) => put(&t.shape, v),
        Data::I32(v) => put(&t.shape, v),
        Data::I64(v) => put(&t.shape, v),
        Data::I8(v) => put(&t.shape, v),
        Data::U8(v) => put(&t.shape, v),
        Data::Bool(v) => put(&t.shape, v),
    };
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    std::fs::write(path, out.map_err(err)?).map_err(err)
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let dir = std::env::temp_dir().join(format!("rbln-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.npy");
        let t = crate::Tensor::new(&[2, 3], vec![1.0, -2.5, 3.0, 4.0, 5.5, -6.0]);
        super::write(&p, &t).unwrap();
        assert_eq!(super::read(&p).unwrap(), t);
        for t in [
            crate::Tensor::new(&[2, 2], vec![1i64, -7, 1 << 40, 0]),
            crate::Tensor::new(&[3], vec![5i32, -1, 0]),
            crate::Tensor::new(&[1, 3], vec![true, false, true]),
            crate::Tensor::new(&[2, 2], vec![-128i8, -1, 0, 127]),
            crate::Tensor::new(&[5], vec![0u8, 1, 127, 128, 255]),
        ] {
            super::write(&p, &t).unwrap();
            assert_eq!(super::read(&p).unwrap(), t);
        }
        // The header numpy writes for int8 and uint8 (`|i1`, `|u1`).
        for (t, descr) in [(crate::Tensor::new(&[1], vec![-3i8]), "'|i1'"), (crate::Tensor::new(&[1], vec![3u8]), "'|u1'")] {
            super::write(&p, &t).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            assert!(String::from_utf8_lossy(&bytes).contains(descr), "{}", String::from_utf8_lossy(&bytes));
        }
        // A file as numpy.save writes it for np.array([[-2, 3]], np.int8):
        // version 1.0, a 118-byte (0x76) header padded with spaces to 64-byte alignment.
        let mut np_i8 = b"\x93NUMPY\x01\x00\x76\x00{'descr': '|i1', 'fortran_order': False, 'shape': (1, 2), }".to_vec();
        np_i8.resize(10 + 0x76 - 1, b' ');
        np_i8.push(b'\n');
        np_i8.extend([0xfe, 0x03]);
        std::fs::write(&p, &np_i8).unwrap();
        assert_eq!(super::read(&p).unwrap(), crate::Tensor::new(&[1, 2], vec![-2i8, 3]));
        let mut buf = Vec::new();
        {
            use npyz::WriterBuilder;
            let mut w = npyz::WriteOptions::<u16>::new().default_dtype().shape(&[1]).writer(&mut buf).begin_nd().unwrap();
            w.push(&3u16).unwrap();
            w.finish().unwrap();
        }
        std::fs::write(&p, &buf).unwrap();
        let e = super::read(&p).unwrap_err();
        assert!(e.contains("is not supported") && e.contains("u2"), "{e}");
        std::fs::write(&p, b"not npy").unwrap();
        assert!(super::read(&p).unwrap_err().contains("not a .npy file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
