//! `rbln._rbln`: the Rust extension module of the `rbln` Python package.
//!
//! It wraps the runtime (`rbln_runtime::Runtime`, `AsyncRuntime`), the
//! model container and the compiler; it re-implements none of them. The
//! pure-Python layer (`rbln/__init__.py`) adds the asyncio entry point,
//! the compile helpers that read files or export PyTorch modules, and the
//! exception classes (`rbln/_errors.py`).
//!
//! Rules kept here: every Rust error becomes a Python exception (nothing
//! reachable from Python panics on purpose), the GIL is released whenever
//! the device or the compiler works, and inputs are read from NumPy's
//! buffers without per-element conversion.

mod asyncrt;
mod decoder;
mod errors;
mod model;
mod quantize;
mod runtime;
mod tensors;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Number of rbln NPUs this process can use (/dev/rblnN nodes, through
/// RBLN_VISIBLE_DEVICES when set; 0 when rbln.ko is not loaded).
#[pyfunction]
fn device_count() -> usize {
    rbln_umd::device_indices().len()
}

/// One dict per NPU of `device_count()`: index (the `device=` argument),
/// path, name, hardware and driver versions, memory, queues, compute
/// cores, DMA engines, health.
#[pyfunction]
fn devices<'py>(py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let infos = py.detach(|| -> Result<Vec<_>, errors::Failure> {
        let mut v = Vec::new();
        for i in rbln_umd::device_indices() {
            let dev = rbln_umd::Device::open(i)?;
            v.push((i, dev.path().display().to_string(), dev.info()));
        }
        Ok(v)
    })?;
    let mut out = Vec::new();
    for (index, path, i) in infos {
        let d = PyDict::new(py);
        d.set_item("index", index)?;
        d.set_item("path", path)?;
        d.set_item("name", "rbln-npu")?;
        d.set_item("vendor_id", i.vendor_id)?;
        d.set_item("device_id", i.device_id)?;
        d.set_item("hw_version", format!("{}.{}", i.hw_version.0, i.hw_version.1))?;
        let (a, b, c) = i.driver_version;
        d.set_item("driver_version", format!("{a}.{b}.{c}"))?;
        d.set_item("uapi_version", i.uapi_version)?;
        d.set_item("memory", i.dram_size)?;
        d.set_item("num_queues", i.num_queues)?;
        d.set_item("num_cores", i.num_cores)?;
        d.set_item("num_dma_engines", i.num_dma_engines)?;
        // The driver's sysfs health (docs/uapi.md 8b): ok, faulted, hung, lost.
        let health = rbln_umd::read_sysfs(i.index, rbln_umd::uapi::sysfs::HEALTH).unwrap_or_else(|_| "unknown".into());
        d.set_item("health", health)?;
        out.push(d);
    }
    Ok(out)
}

/// Nanoseconds from an arbitrary origin on the runtime's clock
/// (`rbln_umd::clock`): fine-grained where `time.perf_counter_ns` is not
/// (in a TCG guest the kernel's clock moves in 4 ms steps). For timing
/// inferences; `rbln-run` measures with the same clock.
#[pyfunction]
fn perf_counter_ns() -> u128 {
    static ORIGIN: std::sync::OnceLock<rbln_umd::clock::Stamp> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(rbln_umd::clock::now).elapsed().as_nanos()
}

#[pymodule]
fn _rbln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<runtime::Runtime>()?;
    m.add_class::<asyncrt::AsyncRuntime>()?;
    m.add_class::<asyncrt::Task>()?;
    m.add_class::<asyncrt::CompletionQueue>()?;
    m.add_class::<model::CompiledModel>()?;
    m.add_class::<decoder::Decoder>()?;
    m.add_class::<decoder::BatchDecoder>()?;
    m.add_function(wrap_pyfunction!(model::_compile, m)?)?;
    m.add_function(wrap_pyfunction!(model::_compile_entries, m)?)?;
    m.add_function(wrap_pyfunction!(model::_compile_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(quantize::_quantize, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(perf_counter_ns, m)?)?;
    m.add_function(wrap_pyfunction!(asyncrt::_time_rust_async, m)?)?;
    Ok(())
}

