//! NumPy arrays to runtime tensors and back.
//!
//! Inputs are read through NumPy's C API: a C-contiguous array of a dtype
//! the runtime passes (float32, int32, int64, int8, uint8, bool) is
//! borrowed, and `Runtime.run` copies it once, into the device's staging
//! buffer (`AsyncRuntime` copies it at the call, since the request runs
//! later).
//! Outputs become NumPy arrays that take ownership of the runtime's
//! vectors, without a copy.

use numpy::{
    dtype, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple};
use rbln_runtime::{Data, DataRef, IoInfo, ModelInfo, Tensor, TensorView};

use crate::errors::Failure;

/// NumPy's name for a runtime dtype name ("f32" -> "float32").
pub fn numpy_name(rbln: &str) -> &'static str {
    match rbln {
        "f32" => "float32",
        "i32" => "int32",
        "i64" => "int64",
        "bool" => "bool",
        "f16" => "float16",
        "i8" => "int8",
        "u8" => "uint8",
        _ => "object",
    }
}

/// How outputs are handed back: NumPy arrays or torch tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    Numpy,
    Torch,
}

impl TensorType {
    /// The tensor type a runtime was asked for; "pt" checks that torch
    /// imports now, rather than after the first inference ran.
    pub fn parse(py: Python<'_>, s: &str) -> PyResult<Self> {
        match s {
            "np" | "numpy" => Ok(TensorType::Numpy),
            "pt" | "torch" => match py.import("torch") {
                Ok(_) => Ok(TensorType::Torch),
                Err(e) => Err(pyo3::exceptions::PyImportError::new_err(format!(
                    "tensor_type=\"pt\" needs PyTorch, which does not import here ({}); install torch or use tensor_type=\"np\"",
                    e.value(py)
                ))),
            },
            _ => Err(Failure::new("RBLNValueError", format!("tensor_type must be \"np\" or \"pt\", not {s:?}")).into()),
        }
    }
}

/// Inputs in the model's order from positional and keyword arguments.
pub fn gather_inputs<'py>(
    info: &ModelInfo,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let want = &info.inputs;
    let names = || want.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", ");
    let count_error = |got: usize| -> PyErr {
        Failure::from(rbln_runtime::Error::InputCount { expected: want.len(), got, names: names() }).into()
    };
    let n_kw = kwargs.map_or(0, |k| k.len());
    let mut slots: Vec<Option<Bound<'py, PyAny>>> = vec![None; want.len()];
    for (i, a) in args.iter().enumerate() {
        match slots.get_mut(i) {
            Some(s) => *s = Some(a),
            None => return Err(count_error(args.len() + n_kw)),
        }
    }
    if let Some(kw) = kwargs {
        for (k, v) in kw.iter() {
            let k: String = k.extract()?;
            let Some(i) = want.iter().position(|b| b.name == k) else {
                return Err(Failure::new("RBLNInputError", format!("the model has no input '{k}' (its inputs: {})", names())).into());
            };
            if slots[i].is_some() {
                return Err(Failure::new("RBLNInputTypeError", format!("input '{k}' given twice (by position and by name)")).into());
            }
            slots[i] = Some(v);
        }
    }
    let got = slots.iter().filter(|s| s.is_some()).count();
    if got != want.len() {
        return Err(count_error(got));
    }
    Ok(slots.into_iter().flatten().collect())
}

/// One input, ready for the runtime: borrowed from a C-contiguous NumPy
/// array of the right dtype (the runtime copies it once, into staging), or
/// converted into an owned tensor (other arrays, lists, torch tensors).
pub struct Input<'py> {
    shape: Vec<u64>,
    data: InputData<'py>,
}

enum InputData<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    I32(PyReadonlyArrayDyn<'py, i32>),
    I64(PyReadonlyArrayDyn<'py, i64>),
    I8(PyReadonlyArrayDyn<'py, i8>),
    U8(PyReadonlyArrayDyn<'py, u8>),
    Bool(PyReadonlyArrayDyn<'py, bool>),
    Owned(Data),
}

impl Input<'_> {
    /// The input borrowed for `Runtime::run_views`.
    pub fn view(&self) -> TensorView<'_> {
        // `borrowed` keeps only C-contiguous arrays, whose as_slice works.
        let data = match &self.data {
            InputData::F32(a) => DataRef::F32(a.as_slice().unwrap_or_default()),
            InputData::I32(a) => DataRef::I32(a.as_slice().unwrap_or_default()),
            InputData::I64(a) => DataRef::I64(a.as_slice().unwrap_or_default()),
            InputData::I8(a) => DataRef::I8(a.as_slice().unwrap_or_default()),
            InputData::U8(a) => DataRef::U8(a.as_slice().unwrap_or_default()),
            InputData::Bool(a) => DataRef::Bool(a.as_slice().unwrap_or_default()),
            InputData::Owned(d) => d.view(),
        };
        TensorView { shape: &self.shape, data }
    }

    /// The input as an owned tensor (one copy when borrowed).
    pub fn into_tensor(self) -> Tensor {
        let data = match self.data {
            InputData::F32(a) => Data::F32(a.as_slice().unwrap_or_default().to_vec()),
            InputData::I32(a) => Data::I32(a.as_slice().unwrap_or_default().to_vec()),
            InputData::I64(a) => Data::I64(a.as_slice().unwrap_or_default().to_vec()),
            InputData::I8(a) => Data::I8(a.as_slice().unwrap_or_default().to_vec()),
            InputData::U8(a) => Data::U8(a.as_slice().unwrap_or_default().to_vec()),
            InputData::Bool(a) => Data::Bool(a.as_slice().unwrap_or_default().to_vec()),
            InputData::Owned(d) => d,
        };
        Tensor { shape: self.shape, data }
    }
}

/// One input (checked against `want` for dtype; shape and values are
/// checked by the runtime with its messages).
pub fn to_input<'py>(obj: &Bound<'py, PyAny>, want: &IoInfo) -> PyResult<Input<'py>> {
    let py = obj.py();
    let arr: Bound<'py, PyUntypedArray> = match obj.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => {
            let np = py.import("numpy")?;
            // Python numbers and sequences carry no dtype: take the
            // model's. Anything else (torch tensors, buffers, array-likes)
            // keeps its own, so a wrong one is reported, not cast.
            let plain = obj.is_instance_of::<PyList>()
                || obj.is_instance_of::<PyTuple>()
                || obj.is_instance_of::<PyFloat>()
                || obj.is_instance_of::<PyInt>()
                || obj.is_instance_of::<PyBool>();
            let a = if plain {
                np.call_method1("asarray", (obj, numpy_name(want.dtype)))?
            } else {
                // torch tensors on the CPU and other array-likes.
                let o = if obj.hasattr("detach")? && obj.hasattr("numpy")? {
                    obj.call_method0("detach")?.call_method0("cpu")?.call_method0("numpy")?
                } else {
                    obj.clone()
                };
                np.call_method1("asarray", (o,))?
            };
            a.cast_into::<PyUntypedArray>().map_err(PyErr::from)?
        }
    };
    let shape: Vec<u64> = arr.shape().iter().map(|&d| d as u64).collect();
    let dt = arr.dtype();
    let data = if dt.is_equiv_to(&dtype::<f32>(py)) {
        borrowed(&arr, InputData::F32)?
    } else if dt.is_equiv_to(&dtype::<i64>(py)) {
        borrowed(&arr, InputData::I64)?
    } else if dt.is_equiv_to(&dtype::<i32>(py)) {
        borrowed(&arr, InputData::I32)?
    } else if dt.is_equiv_to(&dtype::<i8>(py)) {
        borrowed(&arr, InputData::I8)?
    } else if dt.is_equiv_to(&dtype::<u8>(py)) {
        borrowed(&arr, InputData::U8)?
    } else if dt.is_equiv_to(&dtype::<bool>(py)) {
        borrowed(&arr, InputData::Bool)?
    } else {
        return Err(Failure::new(
            "RBLNInputTypeError",
            format!("input '{}': expected dtype {}, got {}", want.name, want.dtype, dt.str()?),
        )
        .into());
    };
    Ok(Input { shape, data })
}

/// A read-only borrow of a C-contiguous array of element type `T`; other
/// layouts are walked element by element into an owned copy.
fn borrowed<'py, T: numpy::Element + Copy>(
    arr: &Bound<'py, PyUntypedArray>,
    wrap: fn(PyReadonlyArrayDyn<'py, T>) -> InputData<'py>,
) -> PyResult<InputData<'py>>
where
    Vec<T>: Into<Data>,
{
    let a = arr.cast::<PyArrayDyn<T>>().map_err(PyErr::from)?;
    let ro = a.try_readonly().map_err(|e| Failure::new("RBLNInputError", format!("input array: {e}")))?;
    // as_slice also accepts Fortran order; the runtime wants row-major.
    if arr.is_c_contiguous() && ro.as_slice().is_ok() {
        return Ok(wrap(ro));
    }
    Ok(InputData::Owned(ro.as_array().iter().copied().collect::<Vec<T>>().into()))
}

/// A runtime tensor as a NumPy array (owning the tensor's vector; one
/// array object, made with its shape).
pub fn to_numpy<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    fn owned<'py, T: numpy::Element>(py: Python<'py>, shape: Vec<usize>, v: Vec<T>) -> PyResult<Bound<'py, PyAny>> {
        let a = numpy::ndarray::ArrayD::from_shape_vec(shape, v)
            .map_err(|e| Failure::new("RBLNRuntimeError", format!("output of the wrong size: {e}")))?;
        Ok(PyArrayDyn::from_owned_array(py, a).into_any())
    }
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    match t.data {
        Data::F32(v) => owned(py, shape, v),
        Data::I32(v) => owned(py, shape, v),
        Data::I64(v) => owned(py, shape, v),
        Data::I8(v) => owned(py, shape, v),
        Data::U8(v) => owned(py, shape, v),
        Data::Bool(v) => owned(py, shape, v),
    }
}

/// Outputs for Python: one array, or a list of them when the model has
/// several.
pub fn outputs_to_py<'py>(py: Python<'py>, outs: Vec<Tensor>, tt: TensorType) -> PyResult<Bound<'py, PyAny>> {
    let mut arrays = Vec::with_capacity(outs.len());
    for t in outs {
        let a = to_numpy(py, t)?;
        arrays.push(match tt {
            TensorType::Numpy => a,
            TensorType::Torch => py.import("torch")?.call_method1("from_numpy", (a,))?,
        });
    }
    if arrays.len() == 1 {
        Ok(arrays.pop().unwrap_or_else(|| py.None().into_bound(py)))
    } else {
        Ok(PyList::new(py, arrays)?.into_any())
    }
}

/// Copy outputs into caller-provided arrays (`out=`): one array for a
/// single-output model, a sequence of them otherwise. Returns `out`.
pub fn write_out<'py>(out: &Bound<'py, PyAny>, outs: Vec<Tensor>, info: &ModelInfo) -> PyResult<Bound<'py, PyAny>> {
    let targets: Vec<Bound<'py, PyAny>> = if outs.len() == 1 && out.cast::<PyUntypedArray>().is_ok() {
        vec![out.clone()]
    } else {
        out.try_iter()?.collect::<PyResult<_>>()?
    };
    if targets.len() != outs.len() {
        return Err(Failure::new(
            "RBLNInputError",
            format!("out: the model has {} output(s), got {} array(s)", outs.len(), targets.len()),
        )
        .into());
    }
    for ((t, dst), b) in outs.into_iter().zip(&targets).zip(&info.outputs) {
        let bad = || -> PyErr {
            Failure::new(
                "RBLNInputError",
                format!(
                    "out for output '{}': expected a writable C-contiguous {} array of shape {:?}",
                    b.name,
                    numpy_name(b.dtype),
                    b.shape
                ),
            )
            .into()
        };
        let arr = dst.cast::<PyUntypedArray>().map_err(|_| bad())?;
        let shape: Vec<u64> = arr.shape().iter().map(|&d| d as u64).collect();
        if shape != t.shape || !arr.is_c_contiguous() {
            return Err(bad());
        }
        match t.data {
            Data::F32(v) => copy_into(arr, &v).map_err(|_| bad())?,
            Data::I32(v) => copy_into(arr, &v).map_err(|_| bad())?,
            Data::I64(v) => copy_into(arr, &v).map_err(|_| bad())?,
            Data::I8(v) => copy_into(arr, &v).map_err(|_| bad())?,
            Data::U8(v) => copy_into(arr, &v).map_err(|_| bad())?,
            Data::Bool(v) => copy_into(arr, &v).map_err(|_| bad())?,
        }
    }
    Ok(out.clone())
}

fn copy_into<T: numpy::Element + Copy>(arr: &Bound<'_, PyUntypedArray>, v: &[T]) -> Result<(), ()> {
    let a = arr.cast::<PyArrayDyn<T>>().map_err(|_| ())?;
    let mut rw = a.try_readwrite().map_err(|_| ())?;
    let s = rw.as_slice_mut().map_err(|_| ())?;
    if s.len() != v.len() {
        return Err(());
    }
    s.copy_from_slice(v);
    Ok(())
}

/// `inspect()`'s dictionary.
pub fn info_dict<'py>(py: Python<'py>, info: &ModelInfo, properties: &[(String, String)]) -> PyResult<Bound<'py, PyDict>> {
    let io = |v: &[IoInfo]| -> PyResult<Bound<'py, PyList>> {
        let l = PyList::empty(py);
        for t in v {
            let d = PyDict::new(py);
            d.set_item("name", &t.name)?;
            d.set_item("dtype", numpy_name(t.dtype))?;
            d.set_item("shape", t.shape.clone())?;
            d.set_item("range", t.range)?;
            l.append(d)?;
        }
        Ok(l)
    };
    let d = PyDict::new(py);
    d.set_item("name", &info.name)?;
    d.set_item("producer", &info.producer)?;
    d.set_item("entry", &info.entry)?;
    d.set_item("entries", info.entries.clone())?;
    d.set_item("inputs", io(&info.inputs)?)?;
    d.set_item("outputs", io(&info.outputs)?)?;
    if !info.state.is_empty() {
        d.set_item("state", info.state.clone())?;
    }
    let mem = PyDict::new(py);
    mem.set_item("arena_bytes", info.arena_bytes)?;
    mem.set_item("staging_bytes", info.staging_bytes)?;
    mem.set_item("weight_bytes", info.weight_bytes)?;
    mem.set_item("weights_used_bytes", info.weights_used_bytes)?;
    d.set_item("memory", mem)?;
    let ops = PyDict::new(py);
    for (op, n) in &info.ops {
        ops.set_item(op, n)?;
    }
    d.set_item("ops", ops)?;
    let props = PyDict::new(py);
    for (k, v) in properties {
        props.set_item(k, v)?;
    }
    d.set_item("properties", props)?;
    Ok(d)
}

/// Every input, in order, borrowed where possible.
pub fn to_inputs<'py>(info: &ModelInfo, inputs: &[Bound<'py, PyAny>]) -> PyResult<Vec<Input<'py>>> {
    inputs.iter().zip(&info.inputs).map(|(o, want)| to_input(o, want)).collect()
}

/// Every input copied into an owned tensor, in order (for requests that
/// run after the call returns: the caller may reuse its arrays at once).
pub fn to_tensors(info: &ModelInfo, inputs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Tensor>> {
    Ok(to_inputs(info, inputs)?.into_iter().map(Input::into_tensor).collect())
}
