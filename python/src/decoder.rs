//! `rbln.Decoder` and `rbln.BatchDecoder`: token generation with a causal
//! decoder whose programs are entry points of one .rbln
//! (rbln_runtime::generate, rbln_runtime::batch), the KV cache on the
//! device.

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use rbln_runtime::batch::BatchDecoder as Batch;
use rbln_runtime::generate::{Generator, Sampling};

use crate::errors::Failure;
use crate::model::model_from;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `sampling` ("greedy", "top-k", "top-p") with its parameters.
fn sampling(name: &str, top_k: usize, top_p: f32, temperature: f32) -> PyResult<Sampling> {
    if !(temperature >= 0.0) || !(0.0..=1.0).contains(&top_p) {
        return Err(PyErr::from(Failure::new("RBLNValueError", "temperature must be >= 0 and top_p in [0, 1]".to_string())));
    }
    Ok(match name {
        "greedy" => Sampling::Greedy,
        "top-k" | "top_k" => Sampling::TopK { k: top_k, temperature },
        "top-p" | "top_p" => Sampling::TopP { p: top_p, temperature },
        other => return Err(PyErr::from(Failure::new("RBLNValueError", format!("sampling {other:?}: greedy, top-k or top-p")))),
    })
}

/// The model loaded on `device` and handed to `make` (a generator over
/// its entry points), without the GIL; the clock made fine-grained first
/// (a TCG guest's kernel clock is coarse; rbln_runtime::clock).
fn load<T>(py: Python<'_>, model: &Bound<'_, PyAny>, device: u32, make: impl FnOnce(rbln_runtime::Runtime) -> rbln_runtime::Result<T> + Send) -> PyResult<T>
where
    T: Send,
{
    let model = model_from(model)?;
    py.detach(|| -> Result<_, Failure> {
        let dev = rbln_umd::Device::open(device)?;
        rbln_runtime::clock::init_with_device(&dev);
        Ok(make(rbln_runtime::Runtime::new(&dev, model)?)?)
    })
    .map_err(PyErr::from)
}

/// A causal decoder on an NPU.
///
/// `Decoder(model, *, device=0)`: `model` is a .rbln path or an
/// `rbln.CompiledModel` whose entry points follow the decoder convention
/// (docs/python.md): a decode step and any prefills. `generate(prompt_ids,
/// ...)` returns a dict with the new `tokens`, `time_to_first_token_ms`,
/// `tokens_per_s` and `prefill_tokens`; `on_token` (a callable) receives
/// each token as soon as it is chosen.
#[pyclass(module = "rbln._rbln", name = "Decoder", frozen)]
pub struct Decoder {
    inner: Mutex<Generator>,
}

#[pymethods]
impl Decoder {
    #[new]
    #[pyo3(signature = (model, *, device = 0))]
    fn py_new(py: Python<'_>, model: &Bound<'_, PyAny>, device: u32) -> PyResult<Self> {
        Ok(Decoder { inner: Mutex::new(load(py, model, device, Generator::new)?) })
    }

    /// The prompt lengths the prefills take, ascending.
    #[getter]
    fn prefill_lengths(&self) -> Vec<u64> {
        lock(&self.inner).prefill_lengths()
    }

    /// Generate up to `max_new_tokens` after `prompt_ids`. `sampling`:
    /// "greedy", "top-k" (`top_k`, `temperature`) or "top-p" (`top_p`,
    /// `temperature`); `seed` makes sampling repeatable; generation stops
    /// after `eos_id`. The prompt goes through the longest prefill that
    /// fits it, the rest through the decode step (all of it with
    /// `prefill=False`).
    #[pyo3(signature = (prompt_ids, *, max_new_tokens = 16, sampling = "greedy", top_k = 50, top_p = 0.9, temperature = 1.0, seed = 0, eos_id = None, prefill = true, on_token = None))]
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
        prefill: bool,
        on_token: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let sampling = self::sampling(sampling, top_k, top_p, temperature)?;
        // A callback error stops the generation after the current token.
        let callback_error: Mutex<Option<PyErr>> = Mutex::new(None);
        let result = py.detach(|| {
            let mut g = lock(&self.inner);
            g.use_prefill(prefill);
            g.generate(&prompt_ids, max_new_tokens, sampling, seed, eos_id, |t| {
                if let Some(cb) = &on_token {
                    Python::attach(|py| {
                        if let Err(e) = cb.call1(py, (t,)) {
                            lock(&callback_error).get_or_insert(e);
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
        d.set_item("prefill_tokens", gen.prefill_tokens)?;
        Ok(d)
    }
}

/// Continuous batching on an NPU: sequences join and leave a batched
/// decode step between steps, each in its own slot of the KV cache on the
/// device.
///
/// `BatchDecoder(model, *, device=0)`: `model` (a .rbln path or an
/// `rbln.CompiledModel`) has a batched decode step and slot prefills as
/// entry points (docs/python.md). `join(prompt_ids, ...)` adds a sequence
/// to a free slot and returns its id; `step()` advances every sequence by
/// one token and returns `[(id, token, finished), ...]` (a finished
/// sequence has left its slot); `cancel(id)` ends one early.
#[pyclass(module = "rbln._rbln", name = "BatchDecoder", frozen)]
pub struct BatchDecoder {
    inner: Mutex<Batch>,
}

#[pymethods]
impl BatchDecoder {
    #[new]
    #[pyo3(signature = (model, *, device = 0))]
    fn py_new(py: Python<'_>, model: &Bound<'_, PyAny>, device: u32) -> PyResult<Self> {
        Ok(BatchDecoder { inner: Mutex::new(load(py, model, device, Batch::new)?) })
    }

    /// Slots in the batch.
    #[getter]
    fn slots(&self) -> usize {
        lock(&self.inner).slots()
    }

    /// Sequences in the batch.
    #[getter]
    fn active(&self) -> usize {
        lock(&self.inner).active()
    }

    /// Add a sequence in a free slot (its prompt's first tokens through
    /// the longest slot prefill that fits); returns its id. Sampling as in
    /// `Decoder.generate`. Raises `rbln.RBLNError` when every slot is busy
    /// or the sequence does not fit the cache.
    #[pyo3(signature = (prompt_ids, *, max_new_tokens = 16, sampling = "greedy", top_k = 50, top_p = 0.9, temperature = 1.0, seed = 0, eos_id = None))]
    #[allow(clippy::too_many_arguments)]
    fn join(
        &self,
        py: Python<'_>,
        prompt_ids: Vec<i64>,
        max_new_tokens: usize,
        sampling: &str,
        top_k: usize,
        top_p: f32,
        temperature: f32,
        seed: u64,
        eos_id: Option<i64>,
    ) -> PyResult<u64> {
        let sampling = self::sampling(sampling, top_k, top_p, temperature)?;
        py.detach(|| lock(&self.inner).join(&prompt_ids, max_new_tokens, sampling, seed, eos_id)).map_err(|e| PyErr::from(Failure::from(e)))
    }

    /// One token for every sequence: `[(id, token, finished), ...]`.
    fn step(&self, py: Python<'_>) -> PyResult<Vec<(u64, i64, bool)>> {
        let emitted = py.detach(|| lock(&self.inner).step()).map_err(|e| PyErr::from(Failure::from(e)))?;
        Ok(emitted.into_iter().map(|e| (e.id, e.token, e.finished)).collect())
    }

    /// End sequence `id` now; False if it is not in the batch.
    fn cancel(&self, id: u64) -> bool {
        lock(&self.inner).cancel(id)
    }
}
