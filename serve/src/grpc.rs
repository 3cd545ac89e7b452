//! The gRPC front end: `inference.GRPCInferenceService` (tonic).
//! Inputs come as `raw_input_contents` (one little-endian buffer per
//! input, in order) or typed `contents`; outputs go back as
//! `raw_output_contents`, as Triton does.

use std::sync::Arc;

use rbln_runtime::Data;
use tonic::{Request, Response, Status};

use crate::error::{Result, ServeError};
use crate::pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use crate::pb::*;
use crate::tensor::{self, DataType, InputData, InputTensor};
use crate::App;

pub struct Service {
    app: Arc<App>,
}

/// The tonic service, with message size limits from `--max-body-bytes`.
pub fn service(app: Arc<App>) -> GrpcInferenceServiceServer<Service> {
    let max = app.max_body;
    GrpcInferenceServiceServer::new(Service { app }).max_decoding_message_size(max).max_encoding_message_size(usize::MAX)
}

fn typed(name: &str, datatype: &str, c: InferTensorContents) -> Result<Data> {
    let has_other = |n: usize| n > 0;
    let wrong = |field: &str| ServeError::bad(format!("input '{name}': datatype {datatype} cannot take contents.{field}"));
    if has_other(c.uint64_contents.len() + c.fp64_contents.len() + c.bytes_contents.len()) {
        return Err(ServeError::bad(format!("input '{name}': only fp32, int, int64, uint and bool contents are supported")));
    }
    // Let the common check name the datatype problem.
    let Some(dt) = DataType::parse(datatype) else { return Ok(Data::F32(vec![])) };
    // The field each datatype's values come in (INT8 in int_contents and
    // UINT8 in uint_contents, as the protocol says).
    let field = match dt {
        DataType::Fp32 => "fp32_contents",
        DataType::Int32 | DataType::Int8 => "int_contents",
        DataType::Int64 => "int64_contents",
        DataType::Uint8 => "uint_contents",
        DataType::Bool => "bool_contents",
    };
    let given = [
        (c.fp32_contents.len(), "fp32_contents"),
        (c.int_contents.len(), "int_contents"),
        (c.int64_contents.len(), "int64_contents"),
        (c.uint_contents.len(), "uint_contents"),
        (c.bool_contents.len(), "bool_contents"),
    ];
    if let Some((_, other)) = given.iter().find(|(n, f)| *n > 0 && *f != field) {
        return Err(wrong(other));
    }
    let elem_err = |i: usize, x: i64| ServeError::bad(format!("input '{name}': element {i} is {x}, not a valid {datatype} value"));
    Ok(match dt {
        DataType::Fp32 => Data::F32(c.fp32_contents),
        DataType::Int32 => Data::I32(c.int_contents),
        DataType::Int64 => Data::I64(c.int64_contents),
        DataType::Int8 => Data::I8(c.int_contents.iter().enumerate().map(|(i, &x)| i8::try_from(x).map_err(|_| elem_err(i, x as i64))).collect::<Result<_>>()?),
        DataType::Uint8 => Data::U8(c.uint_contents.iter().enumerate().map(|(i, &x)| u8::try_from(x).map_err(|_| elem_err(i, x as i64))).collect::<Result<_>>()?),
        DataType::Bool => Data::Bool(c.bool_contents),
    })
}

/// Check and convert a ModelInfer request's inputs.
pub fn request_inputs(spec: &tensor::ModelSpec, req: &mut ModelInferRequest) -> Result<Vec<rbln_runtime::Tensor>> {
    let raw = std::mem::take(&mut req.raw_input_contents);
    if !raw.is_empty() && raw.len() != req.inputs.len() {
        return Err(ServeError::bad(format!("raw_input_contents has {} entries for {} inputs (it must have one per input)", raw.len(), req.inputs.len())));
    }
    let mut list = Vec::with_capacity(req.inputs.len());
    for (i, inp) in std::mem::take(&mut req.inputs).into_iter().enumerate() {
        let data = match (raw.get(i), inp.contents) {
            (Some(_), Some(c)) if c != InferTensorContents::default() => {
                return Err(ServeError::bad(format!("input '{}' has both raw_input_contents and contents", inp.name)));
            }
            (Some(r), _) => InputData::Raw(r),
            (None, Some(c)) => InputData::Typed(typed(&inp.name, &inp.datatype, c)?),
            (None, None) => InputData::Missing,
        };
        list.push(InputTensor { name: inp.name, datatype: inp.datatype, shape: inp.shape, data });
    }
    tensor::to_runtime_inputs(spec, list)
}

#[tonic::async_trait]
impl GrpcInferenceService for Service {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> std::result::Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> std::result::Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.app.is_ready() }))
    }

    async fn model_ready(&self, req: Request<ModelReadyRequest>) -> std::result::Result<Response<ModelReadyResponse>, Status> {
        let r = req.into_inner();
        match self.app.repo.get(&r.name, Some(&r.version)) {
            Ok(_) => Ok(Response::new(ModelReadyResponse { ready: true })),
            Err(e) if e.kind == crate::error::Kind::NotReady => Ok(Response::new(ModelReadyResponse { ready: false })),
            Err(e) => Err(e.into()),
        }
    }

    async fn server_metadata(&self, _: Request<ServerMetadataRequest>) -> std::result::Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: crate::SERVER_NAME.into(),
            version: crate::SERVER_VERSION.into(),
            extensions: crate::EXTENSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn model_metadata(&self, req: Request<ModelMetadataRequest>) -> std::result::Result<Response<ModelMetadataResponse>, Status> {
        let r = req.into_inner();
        let m = self.app.repo.get(&r.name, Some(&r.version))?;
        let conv = |t: &tensor::TensorSpec| model_metadata_response::TensorMetadata { name: t.name.clone(), datatype: t.datatype.name().into(), shape: t.shape.clone() };
        Ok(Response::new(ModelMetadataResponse {
            name: m.name.clone(),
            versions: vec![m.version.to_string()],
            platform: "rbln".into(),
            inputs: m.spec.inputs.iter().map(conv).collect(),
            outputs: m.spec.outputs.iter().map(conv).collect(),
        }))
    }

    async fn model_infer(&self, req: Request<ModelInferRequest>) -> std::result::Result<Response<ModelInferResponse>, Status> {
        let _inflight = self.app.enter();
        let start = rbln_runtime::clock::now();
        let mut r = req.into_inner();
        let name = r.model_name.clone();
        let out = self.infer(&mut r).await;
        self.app.record(&name, "grpc", start, &out.as_ref().map(|_| ()));
        Ok(Response::new(out?))
    }

    async fn repository_index(&self, req: Request<RepositoryIndexRequest>) -> std::result::Result<Response<RepositoryIndexResponse>, Status> {
        let r = req.into_inner();
        let models = self
            .app
            .repo
            .index(r.ready)
            .into_iter()
            .map(|e| repository_index_response::ModelIndex { name: e.name, version: e.version, state: e.state.into(), reason: e.reason })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(&self, req: Request<RepositoryModelLoadRequest>) -> std::result::Result<Response<RepositoryModelLoadResponse>, Status> {
        let r = req.into_inner();
        if let Some(k) = r.parameters.keys().next() {
            return Err(ServeError::bad(format!("load of model '{}': parameter '{k}' is not supported", r.model_name)).into());
        }
        let repo = self.app.repo.clone();
        let name = r.model_name.clone();
        tokio::task::spawn_blocking(move || repo.load(&name).map(|_| ())).await.map_err(|e| Status::internal(e.to_string()))??;
        eprintln!("rbln-serve: model '{}' loaded (repository extension, gRPC)", r.model_name);
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(&self, req: Request<RepositoryModelUnloadRequest>) -> std::result::Result<Response<RepositoryModelUnloadResponse>, Status> {
        let r = req.into_inner();
        if let Some(k) = r.parameters.keys().find(|k| k.as_str() != "unload_dependents") {
            return Err(ServeError::bad(format!("unload of model '{}': parameter '{k}' is not supported", r.model_name)).into());
        }
        let repo = self.app.repo.clone();
        let name = r.model_name.clone();
        tokio::task::spawn_blocking(move || repo.unload(&name).map(drop)).await.map_err(|e| Status::internal(e.to_string()))??;
        eprintln!("rbln-serve: model '{}' unloaded (gRPC)", r.model_name);
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }
}

impl Service {
    async fn infer(&self, r: &mut ModelInferRequest) -> Result<ModelInferResponse> {
        let m = self.app.repo.get(&r.model_name, Some(&r.model_version))?;
        let inputs = request_inputs(&m.spec, r)?;
        let requested: Vec<(String, Option<bool>)> = r.outputs.iter().map(|o| (o.name.clone(), None)).collect();
        let choices = tensor::choose_outputs(&m.spec, &requested, true)?;
        let outs = crate::run_model(&m, inputs).await?;
        let mut resp = ModelInferResponse { model_name: m.name.clone(), model_version: m.version.to_string(), id: r.id.clone(), ..Default::default() };
        for c in &choices {
            let t = &outs[c.index];
            resp.outputs.push(model_infer_response::InferOutputTensor {
                name: m.spec.outputs[c.index].name.clone(),
                datatype: DataType::of(&t.data).name().into(),
                shape: t.shape.iter().map(|&d| d as i64).collect(),
                ..Default::default()
            });
            resp.raw_output_contents.push(tensor::raw_bytes(&t.data).into());
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{ModelSpec, TensorSpec};

    fn spec() -> ModelSpec {
        ModelSpec {
            inputs: vec![
                TensorSpec { name: "q".into(), datatype: DataType::Int8, shape: vec![3], range: None },
                TensorSpec { name: "u".into(), datatype: DataType::Uint8, shape: vec![2], range: None },
            ],
            outputs: vec![TensorSpec { name: "o".into(), datatype: DataType::Int8, shape: vec![3], range: None }],
            batching: None,
        }
    }

    fn request(q: InferTensorContents, u: InferTensorContents) -> ModelInferRequest {
        let input = |name: &str, dt: &str, shape: Vec<i64>, c: InferTensorContents| model_infer_request::InferInputTensor {
            name: name.into(),
            datatype: dt.into(),
            shape,
            parameters: Default::default(),
            contents: Some(c),
        };
        ModelInferRequest { inputs: vec![input("q", "INT8", vec![3], q), input("u", "UINT8", vec![2], u)], ..Default::default() }
    }

    fn ints(v: &[i32]) -> InferTensorContents {
        InferTensorContents { int_contents: v.to_vec(), ..Default::default() }
    }

    fn uints(v: &[u32]) -> InferTensorContents {
        InferTensorContents { uint_contents: v.to_vec(), ..Default::default() }
    }

    #[test]
    fn int8_in_int_contents_and_uint8_in_uint_contents() {
        let ts = request_inputs(&spec(), &mut request(ints(&[-128, 0, 127]), uints(&[0, 255]))).unwrap();
        assert_eq!(ts[0], rbln_runtime::Tensor::new(&[3], vec![-128i8, 0, 127]));
        assert_eq!(ts[1], rbln_runtime::Tensor::new(&[2], vec![0u8, 255]));
        let err = |q, u| request_inputs(&spec(), &mut request(q, u)).unwrap_err().msg;
        assert_eq!(err(ints(&[1, 128, 3]), uints(&[0, 1])), "input 'q': element 1 is 128, not a valid INT8 value");
        assert_eq!(err(ints(&[-129, 0, 3]), uints(&[0, 1])), "input 'q': element 0 is -129, not a valid INT8 value");
        assert_eq!(err(ints(&[1, 2, 3]), uints(&[0, 256])), "input 'u': element 1 is 256, not a valid UINT8 value");
        assert_eq!(err(uints(&[1, 2, 3]), uints(&[0, 1])), "input 'q': datatype INT8 cannot take contents.uint_contents");
        assert_eq!(err(ints(&[1, 2, 3]), ints(&[0, 1])), "input 'u': datatype UINT8 cannot take contents.int_contents");
        assert_eq!(err(ints(&[1, 2]), uints(&[0, 1])), "input 'q': 2 values for shape [3] (3 expected)");
        let both = InferTensorContents { int_contents: vec![1, 2, 3], bool_contents: vec![true; 3], ..Default::default() };
        assert_eq!(err(both, uints(&[0, 1])), "input 'q': datatype INT8 cannot take contents.bool_contents");
        let u64s = InferTensorContents { uint64_contents: vec![1, 2], ..Default::default() };
        assert_eq!(err(ints(&[1, 2, 3]), u64s), "input 'u': only fp32, int, int64, uint and bool contents are supported");
    }

    #[test]
    fn raw_int8_and_uint8_contents() {
        let mut r = request(InferTensorContents::default(), InferTensorContents::default());
        r.raw_input_contents = vec![vec![0x80u8, 0xff, 0x7f].into(), vec![0u8, 255].into()];
        let ts = request_inputs(&spec(), &mut r).unwrap();
        assert_eq!(ts[0].data, Data::I8(vec![-128, -1, 127]));
        assert_eq!(ts[1].data, Data::U8(vec![0, 255]));
    }
}
