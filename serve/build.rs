// Generates the gRPC service (tonic) and messages (prost) from
// proto/grpc_service.proto, with the protoc binary that the
// protoc-bin-vendored crate ships (no system protoc needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    // `bytes` fields as `bytes::Bytes`: raw tensor buffers are sliced out of
    // the received message instead of copied, and cloned for free.
    tonic_prost_build::configure().bytes(".").build_client(true).build_server(true).compile_protos(&["proto/grpc_service.proto"], &["proto"])?;
    Ok(())
}
