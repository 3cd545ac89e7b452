//! `.npy` files in and out (f32, C order).

use std::path::Path;

use npyz::WriterBuilder;

use crate::Tensor;

/// Read an f32 tensor from a `.npy` file.
pub fn read(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| format!("{}: not a .npy file: {e}", path.display()))?;
    if npy.order() != npyz::Order::C {
        return Err(format!("{}: Fortran-order arrays are not supported; save it in C order", path.display()));
    }
    let shape = npy.shape().to_vec();
    let data = npy
        .into_vec::<f32>()
        .map_err(|e| format!("{}: expected float32 data ({e}); convert with numpy's astype(np.float32)", path.display()))?;
    Ok(Tensor { shape, data })
}

/// Write an f32 tensor to a `.npy` file.
pub fn write(path: &Path, t: &Tensor) -> Result<(), String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut out = Vec::new();
    let mut w = npyz::WriteOptions::new().default_dtype().shape(&t.shape).writer(&mut out).begin_nd().map_err(err)?;
    w.extend(t.data.iter().copied()).map_err(err)?;
    w.finish().map_err(err)?;
    std::fs::write(path, out).map_err(err)
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
        std::fs::write(&p, b"not npy").unwrap();
        assert!(super::read(&p).unwrap_err().contains("not a .npy file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
