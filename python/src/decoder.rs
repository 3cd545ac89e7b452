//! `rbln.Decoder`: token generation with a causal decoder's prefill and
//! decode programs (rbln_runtime::generate), the KV cache on the device.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use rbln_runtime::generate::{Generator, Sampling};

use crate::errors::Failure;
use crate::model::model_from;

/// A causal decoder on an NPU.
///
/// `Decoder(decode, *, prefill=None, device=0)`: `decode` (and `prefill`)
/// are .rbln paths or `rbln.CompiledModel`s following the decoder
/// convention (docs/python.md). `generate(prompt_ids, ...)` returns a dict
/// with the new `tokens`, `time_to_first_token_ms`, `tokens_per_s` and
/// `used_prefill`; `on_token` (a callable) receives each token as soon as
/// it is chosen.
#[pyclass(module = "rbln._rbln", name = "Decoder", frozen)]
pub struct Decoder {
    inner: Mutex<Generator>,
}

#[pymethods]
impl Decoder {
    #[new]
    #[pyo3(signature = (decode, *, prefill = None, device = 0))]
    fn py_new(py: Python<'_>, decode: &Bound<'_, PyAny>, prefill: Option<&Bound<'_, PyAny>>, device: u32) -> PyResult<Self> {
        let decode = model_from(decode)?;
        let prefill = prefill.map(model_from).transpose()?;
        let g = py
            .detach(|| -> Result<_, Failure> {
                let dev = rbln_umd::Device::open(device)?;
                // Fine-grained timings in a TCG guest too (rbln_runtime::clock).
                rbln_runtime::clock::init_with_device(&dev);
                let d = rbln_runtime::Runtime::new(&dev, decode)?;
                let p = prefill.map(|m| rbln_runtime::Runtime::new(&dev, m)).transpose()?;
                Ok(Generator::new(d, p)?)
            })
            .map_err(PyErr::from)?;
        Ok(Decoder { inner: Mutex::new(g) })
    }

    /// Generate up to `max_new_tokens` after `prompt_ids`. `sampling`:
    /// "greedy", "top-k" (`top_k`, `temperature`) or "top-p" (`top_p`,
    /// `temperature`); `seed` makes sampling repeatable; generation stops
    /// after `eos_id`.
    #[pyo3(signature = (prompt_ids, *, max_new_tokens = 16, sampling = "greedy", top_k = 50, top_p = 0.9, temperature = 1.0, seed = 0, eos_id = None, on_token = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt_ids: Vec<i64>,
        max_new_tokens: usize,
        sampling: &str,
        top_k: usize,
        top_p: f32,
        temperature: f32,
        seed: u64,
        eos_id: Option<i64>,
        on_token: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let sampling = match sampling {
            "greedy" => Sampling::Greedy,
            "top-k" | "top_k" => Sampling::TopK { k: top_k, temperature },
            "top-p" | "top_p" => Sampling::TopP { p: top_p, temperature },
            other => return Err(PyErr::from(Failure::new("RBLNValueError", format!("sampling {other:?}: greedy, top-k or top-p")))),
        };
        if !(temperature >= 0.0) || !(0.0..=1.0).contains(&top_p) {
            return Err(PyErr::from(Failure::new("RBLNValueError", "temperature must be >= 0 and top_p in [0, 1]".to_string())));
        }
        // A callback error stops the generation after the current token.
        let callback_error: Mutex<Option<PyErr>> = Mutex::new(None);
        let result = py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            g.generate(&prompt_ids, max_new_tokens, sampling, seed, eos_id, |t| {
                if let Some(cb) = &on_token {
                    Python::attach(|py| {
                        if let Err(e) = cb.call1(py, (t,)) {
                            callback_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                        }
                    });
                }
            })
        });
        if let Some(e) = callback_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        let gen = result.map_err(|e| PyErr::from(Failure::from(e)))?;
        let d = PyDict::new(py);
        d.set_item("tokens", gen.tokens)?;
        d.set_item("time_to_first_token_ms", gen.time_to_first_token_ms)?;
        d.set_item("tokens_per_s", gen.tokens_per_s)?;
        d.set_item("used_prefill", gen.used_prefill)?;
        Ok(d)
    }
}
