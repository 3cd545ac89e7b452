//! `rbln.quantize`: rbln-quantize (calibrated on the NPU) from Python.

use prost::Message;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::Failure;

/// (layer, tensor, cosine similarity, largest error / largest |float|)
type Row = (String, String, f64, f64);

/// Quantise the float ONNX model `data` over the samples of the `.npz`
/// at `calibration`; returns the QDQ model's bytes and the per-layer
/// report (empty without `report`). The GIL is released throughout.
#[pyfunction]
#[pyo3(signature = (data, calibration, method, percentile, reduce_range, device, report))]
#[allow(clippy::too_many_arguments)]
pub fn _quantize<'py>(py: Python<'py>, data: &[u8], calibration: &str, method: &str, percentile: f64, reduce_range: bool, device: u32, report: bool) -> PyResult<(Bound<'py, PyBytes>, Vec<Row>)> {
    use rbln_quantize as q;
    let method = match method {
        "minmax" => q::Method::MinMax,
        "percentile" => q::Method::Percentile(percentile),
        m => return Err(Failure::new("RBLNValueError", format!("method '{m}': expected 'minmax' or 'percentile'")).into()),
    };
    let (bytes, rows) = py.detach(|| -> Result<(Vec<u8>, Vec<Row>), Failure> {
        let compile_err = |e: String| Failure::new("RBLNCompileError", e);
        let mut m = rbln_compile::onnx::decode(data).map_err(Failure::from)?;
        let folded = q::fold_batchnorm(&mut m).map_err(compile_err)?;
        let float = if folded > 0 { m.encode_to_vec() } else { data.to_vec() };
        let p = q::plan(&m).map_err(compile_err)?;
        let samples = q::read_npz(std::path::Path::new(calibration), &m).map_err(|e| Failure::new("RBLNValueError", e))?;
        let dev = rbln_umd::Device::open(device)?;
        let run_err = |e: String| Failure::new("RBLNRuntimeError", e);
        let ranges = q::calibrate(&dev, &float, &p, &samples, method).map_err(run_err)?;
        let out = q::rewrite(&m, &p, &ranges, q::QuantOptions { reduce_range }).map_err(compile_err)?.encode_to_vec();
        let rows = if report {
            q::report(&dev, &float, &out, &p, &samples).map_err(run_err)?.into_iter().map(|r| (r.target, r.tensor, r.cosine, r.max_rel)).collect()
        } else {
            Vec::new()
        };
        Ok((out, rows))
    })?;
    Ok((PyBytes::new(py, &bytes), rows))
}
