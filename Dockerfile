# The gpuledger binary in a small image: one binary for every subcommand (exporter, aggregator,
# reclaimer, import, export, demo). Build from the repository root:
#
#   docker build -t gpuledger:latest .
#
# The first stage compiles the bundled DuckDB (20-40 minutes of C++ on 2 cores). The binary is
# stripped of debug info (the release profile keeps line tables, mostly DuckDB's, which would
# make the image about 1.3 GB). The exporter loads libnvidia-ml at run time: on Kubernetes the
# NVIDIA container runtime (`runtimeClassName: nvidia`, as in deploy/kubernetes) mounts it.
# The image runs as an unprivileged user; the aggregator's ledger and the exporter's spool are
# volumes (see deploy/kubernetes).

FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin gpuledger \
 && strip --strip-debug target/release/gpuledger

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/gpuledger /usr/local/bin/gpuledger
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpuledger"]
CMD ["--help"]
