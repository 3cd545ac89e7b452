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
    /// A C-contiguous, aligned, native-endian ndarray of a dtype the
    /// runtime passes, read in place through its data pointer.
    Raw(RawArray<'py>),
    F32(PyReadonlyArrayDyn<'py, f32>),
    I32(PyReadonlyArrayDyn<'py, i32>),
    I64(PyReadonlyArrayDyn<'py, i64>),
    I8(PyReadonlyArrayDyn<'py, i8>),
    U8(PyReadonlyArrayDyn<'py, u8>),
    Bool(PyReadonlyArrayDyn<'py, bool>),
    Owned(Data),
}

/// The common case of an input, taken without rust-numpy's borrow
/// bookkeeping (a process-wide table of borrowed arrays, updated at every
/// borrow and release: about 0.7 k of the extension's 4.8 k guest
/// instructions per `Runtime.run` of a small model, TCG plugin count). The array
/// is only read, and only while `Input` lives; the bookkeeping guards
/// against a Rust borrow that writes the same array, which `run` never
/// holds at the same time (`out=` arrays are written after the inputs are
/// dropped).
struct RawArray<'py> {
    /// Keeps the array (and so its data) alive.
    _array: Bound<'py, PyUntypedArray>,
    data: *const u8,
    elements: usize,
    dtype: RawDType,
}

#[derive(Clone, Copy)]
enum RawDType {
    F32,
    I32,
    I64,
    I8,
    U8,
}

impl<'py> RawArray<'py> {
    /// `arr` as an input if it is C-contiguous, native-endian and of a
    /// dtype the runtime passes: read in place when aligned, else copied
    /// byte-wise into an aligned vector (a typed slice of unaligned data
    /// would be undefined behaviour). None: the general path takes it,
    /// with its conversions and error messages.
    fn input(arr: &Bound<'py, PyUntypedArray>) -> Option<InputData<'py>> {
        use numpy::npyffi::{NPY_ARRAY_ALIGNED, NPY_ARRAY_C_CONTIGUOUS};
        let dt = arr.dtype();
        if dt.is_native_byteorder() == Some(false) {
            return None;
        }
        let dtype = match (dt.kind(), dt.itemsize()) {
            (b'f', 4) => RawDType::F32,
            (b'i', 4) => RawDType::I32,
            (b'i', 8) => RawDType::I64,
            (b'i', 1) => RawDType::I8,
            (b'u', 1) => RawDType::U8,
            // bool stays on the checked path: a NumPy bool array viewed
            // from bytes may hold values other than 0 and 1, which a Rust
            // bool must not.
            _ => return None,
        };
        // SAFETY: `arr` is a live ndarray (the cast checked its type), so
        // its object fields are readable while we hold the reference.
        let (data, flags) = unsafe {
            let f = &*numpy::npyffi::_PyArray_GET_ITEM_DATA(arr.as_array_ptr());
            (f.data as *const u8, f.flags)
        };
        let elements = arr.len();
        if flags & NPY_ARRAY_C_CONTIGUOUS == 0 || (data.is_null() && elements != 0) {
            return None;
        }
        let raw = Self { _array: arr.clone(), data, elements, dtype };
        if flags & NPY_ARRAY_ALIGNED != 0 {
            return Some(InputData::Raw(raw));
        }
        Some(InputData::Owned(match dtype {
            RawDType::F32 => Data::F32(raw.unaligned_copy()),
            RawDType::I32 => Data::I32(raw.unaligned_copy()),
            RawDType::I64 => Data::I64(raw.unaligned_copy()),
            RawDType::I8 => Data::I8(raw.unaligned_copy()),
            RawDType::U8 => Data::U8(raw.unaligned_copy()),
        }))
    }

    /// The elements copied out as `T` (the element type `dtype` names),
    /// whatever the data's alignment.
    fn unaligned_copy<T: Copy>(&self) -> Vec<T> {
        (0..self.elements)
            // SAFETY: `input` checked that the array is C-contiguous with
            // `elements` elements of `T`'s size and kind; `read_unaligned`
            // needs no alignment.
            .map(|i| unsafe { self.data.cast::<T>().add(i).read_unaligned() })
            .collect()
    }

    /// The elements as `T`, which must be the element type `dtype` names.
    fn slice<T>(&self) -> &[T] {
        if self.elements == 0 {
            return &[];
        }
        // SAFETY: `RawArray::input` made a RawArray of an array it found
        // C-contiguous and aligned, and checked that its elements are `T` (kind and size; every
        // caller below matches `dtype`), so `data` points at `elements`
        // initialised values of `T`. `self` keeps the array alive for the
        // slice's lifetime; nothing in this extension writes it meanwhile
        // (see RawArray).
        unsafe { std::slice::from_raw_parts(self.data.cast::<T>(), self.elements) }
    }

    fn view(&self) -> DataRef<'_> {
        match self.dtype {
            RawDType::F32 => DataRef::F32(self.slice()),
            RawDType::I32 => DataRef::I32(self.slice()),
            RawDType::I64 => DataRef::I64(self.slice()),
            RawDType::I8 => DataRef::I8(self.slice()),
            RawDType::U8 => DataRef::U8(self.slice()),
        }
    }
}

impl Input<'_> {
    /// The input borrowed for `Runtime::run_views`.
    pub fn view(&self) -> TensorView<'_> {
        // `borrowed` keeps only C-contiguous arrays, whose as_slice works.
        let data = match &self.data {
            InputData::Raw(r) => r.view(),
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
        match self.data {
            InputData::Owned(data) => Tensor { shape: self.shape, data },
            _ => self.view().to_tensor(),
        }
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
    if let Some(data) = RawArray::input(&arr) {
        return Ok(Input { shape, data });
    }
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

/// Outputs up to this size are copied into an array NumPy allocates;
/// larger ones are handed over without a copy. Wrapping a vector costs an
/// owner object and ndarray's shape bookkeeping, more than copying a few
/// KiB; copying costs more beyond.
const COPY_OUTPUT_BYTES: usize = 64 << 10;

/// A runtime tensor as a NumPy array: a copy in an array NumPy owns when
/// small, else an array owning the tensor's vector.
pub fn to_numpy<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    fn owned<'py, T: numpy::Element + Copy>(py: Python<'py>, shape: Vec<usize>, v: Vec<T>) -> PyResult<Bound<'py, PyAny>> {
        let wrong = |what: String| Failure::new("RBLNRuntimeError", format!("output of the wrong size: {what}"));
        if std::mem::size_of_val(v.as_slice()) <= COPY_OUTPUT_BYTES {
            if shape.iter().product::<usize>() != v.len() {
                return Err(wrong(format!("{} elements for shape {shape:?}", v.len())).into());
            }
            // SAFETY: `new` leaves the elements uninitialised; every one of
            // them is written from `v` below before Python can see the
            // array (a fresh C-order array of exactly `v.len()` elements).
            let a = unsafe { PyArrayDyn::<T>::new(py, shape, false) };
            if !v.is_empty() {
                // SAFETY: the array was just created here: C-contiguous,
                // `v.len()` elements at a non-null aligned pointer, not
                // shared with any other reference yet.
                unsafe { std::slice::from_raw_parts_mut(a.data(), v.len()) }.copy_from_slice(&v);
            }
            return Ok(a.into_any());
        }
        let a = numpy::ndarray::ArrayD::from_shape_vec(shape, v).map_err(|e| wrong(e.to_string()))?;
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
