fn main() {
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&["proto/peer.proto"], &["proto"])
        .expect("compiling the peer protocol (needs protoc: scripts/setup.sh installs protobuf-compiler)");
}
