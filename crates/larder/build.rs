fn main() {
    tonic_prost_build::configure()
        .compile_protos(&["proto/csi.proto"], &["proto"])
        .expect("compiling the CSI protocol (needs protoc: scripts/setup.sh installs protobuf-compiler)");
}
