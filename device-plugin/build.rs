// Generates the kubelet device plugin API (tonic services, prost messages)
// from proto/deviceplugin/v1beta1/api.proto with the vendored protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/deviceplugin/v1beta1/api.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/deviceplugin/v1beta1/api.proto"], &["proto"])?;
    Ok(())
}
