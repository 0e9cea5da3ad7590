# larder's image: the release binary on Debian 12 (the system it is built on), with fuse3 for
# fusermount3 and the CA certificates S3 over TLS needs.
#
#   cargo build --release -p larder
#   docker build -t ghcr.io/larder/larder:0.1.0 .
#
# The image runs `larder` with the arguments it is given: `csi ...` in Kubernetes (contrib/kubernetes),
# or `mount ... --foreground` in a container of its own.
FROM debian:12-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends fuse3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY target/release/larder /usr/local/bin/larder
ENTRYPOINT ["/usr/local/bin/larder"]
