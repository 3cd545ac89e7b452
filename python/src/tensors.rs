//! NumPy arrays to runtime tensors and back.
//!
//! Inputs are read through NumPy's C API: a C-contiguous array of a dtype
//! the runtime passes (float32, int32, int64, bool) is copied once into
//! the tensor (one memcpy; the runtime then copies it into the device's
//! staging buffer). Outputs become NumPy arrays that take ownership of the
//! runtime's vectors, without a copy.

use numpy::{
    dtype, PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple};
use rbln_runtime::{Data, IoInfo, ModelInfo, Tensor};

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
    pub fn parse(s: &str) -> Result<Self, Failure> {
        match s {
            "np" | "numpy" => Ok(TensorType::Numpy),
            "pt" | "torch" => Ok(TensorType::Torch),
            _ => Err(Failure::new("RBLNValueError", format!("tensor_type must be \"np\" or \"pt\", not {s:?}"))),
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

/// One input as a runtime tensor (checked against `want` for dtype; shape
/// and values are checked by the runtime with its messages).
pub fn to_tensor(obj: &Bound<'_, PyAny>, want: &IoInfo) -> PyResult<Tensor> {
    let py = obj.py();
    let arr: Bound<'_, PyUntypedArray> = match obj.cast::<PyUntypedArray>() {
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
        Data::F32(read::<f32>(&arr)?)
    } else if dt.is_equiv_to(&dtype::<i64>(py)) {
        Data::I64(read::<i64>(&arr)?)
    } else if dt.is_equiv_to(&dtype::<i32>(py)) {
        Data::I32(read::<i32>(&arr)?)
    } else if dt.is_equiv_to(&dtype::<bool>(py)) {
        Data::Bool(read::<bool>(&arr)?)
    } else {
        return Err(Failure::new(
            "RBLNInputTypeError",
            format!("input '{}': expected dtype {}, got {}", want.name, want.dtype, dt.str()?),
        )
        .into());
    };
    Ok(Tensor { shape, data })
}

/// The elements of an array of element type `T`: one memcpy when it is
/// C-contiguous, an element walk otherwise.
fn read<T: numpy::Element + Copy>(arr: &Bound<'_, PyUntypedArray>) -> PyResult<Vec<T>> {
    let a = arr.cast::<PyArrayDyn<T>>().map_err(PyErr::from)?;
    let ro = a.try_readonly().map_err(|e| Failure::new("RBLNInputError", format!("input array: {e}")))?;
    // as_slice also accepts Fortran order; the runtime wants row-major.
    if arr.is_c_contiguous() {
        if let Ok(s) = ro.as_slice() {
            return Ok(s.to_vec());
        }
    }
    Ok(ro.as_array().iter().copied().collect())
}

/// A runtime tensor as a NumPy array (owning the tensor's vector).
pub fn to_numpy<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    Ok(match t.data {
        Data::F32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::I32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::I64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        Data::Bool(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
    })
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
    d.set_item("inputs", io(&info.inputs)?)?;
    d.set_item("outputs", io(&info.outputs)?)?;
    let mem = PyDict::new(py);
    mem.set_item("arena_bytes", info.arena_bytes)?;
    mem.set_item("staging_bytes", info.staging_bytes)?;
    mem.set_item("weight_bytes", info.weight_bytes)?;
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

/// Every input converted, in order.
pub fn to_tensors(info: &ModelInfo, inputs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Tensor>> {
    inputs.iter().zip(&info.inputs).map(|(o, want)| to_tensor(o, want)).collect()
}
