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
    let dt = DataType::parse(datatype);
    let has_other = |n: usize| n > 0;
    let wrong = |field: &str| ServeError::bad(format!("input '{name}': datatype {datatype} cannot take contents.{field}"));
    let (f, i, l, b) = (c.fp32_contents.len(), c.int_contents.len(), c.int64_contents.len(), c.bool_contents.len());
    if has_other(c.uint_contents.len() + c.uint64_contents.len() + c.fp64_contents.len() + c.bytes_contents.len()) {
        return Err(ServeError::bad(format!("input '{name}': only fp32, int, int64 and bool contents are supported")));
    }
    let data = match dt {
        Some(DataType::Fp32) => Data::F32(c.fp32_contents),
        Some(DataType::Int32) => Data::I32(c.int_contents),
        Some(DataType::Int64) => Data::I64(c.int64_contents),
        Some(DataType::Bool) => Data::Bool(c.bool_contents),
        // Let the common check name the datatype problem.
        None => return Ok(Data::F32(vec![])),
    };
    let used = match dt {
        Some(DataType::Fp32) => f,
        Some(DataType::Int32) => i,
        Some(DataType::Int64) => l,
        _ => b,
    };
    for (n, field) in [(f, "fp32_contents"), (i, "int_contents"), (l, "int64_contents"), (b, "bool_contents")] {
        if n > 0 && n != used {
            return Err(wrong(field));
        }
    }
    if f + i + l + b != used {
        let field = [(f, "fp32_contents"), (i, "int_contents"), (l, "int64_contents"), (b, "bool_contents")].into_iter().find(|(n, _)| *n > 0).map_or("?", |x| x.1);
        return Err(wrong(field));
    }
    Ok(data)
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
