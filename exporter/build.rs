//! Generates the kubelet pod-resources gRPC client (and the server half the tests' fake kubelet
//! uses) from the vendored proto. protox parses the proto in Rust, so no protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["podresources/v1/api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
