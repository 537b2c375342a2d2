# One image per role, each from its own build target. From the repository root:
#
#   docker build --target exporter   -t gpuledger-exporter:latest .   # every GPU node
#   docker build --target reclaimer  -t gpuledger-reclaimer:latest .  # beside the scheduler
#   docker build --target aggregator -t gpuledger:latest .            # the ledger (all subcommands)
#
# The exporter and reclaimer images build only their own packages, which link no DuckDB: no C++
# is compiled for them (a few minutes on 2 cores). The aggregator image compiles the bundled
# DuckDB (20-40 minutes of C++ on 2 cores) and holds the `gpuledger` binary with every subcommand.
# Binaries are stripped of debug info. The exporter loads libnvidia-ml at run time: on
# Kubernetes the NVIDIA container runtime (`runtimeClassName: nvidia`, as in deploy/kubernetes)
# mounts it. The images run as an unprivileged user; the aggregator's ledger and the exporter's
# spool are volumes (see deploy/kubernetes).

FROM rust:1-bookworm AS toolchain
RUN apt-get update \
 && apt-get install -y --no-install-recommends libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .

# The lean roles: no libduckdb-sys in their dependency trees.
FROM toolchain AS build-lean
RUN cargo build --release --locked -p gpuledger-exporter -p gpuledger-reclaimer \
 && strip --strip-debug target/release/gpuledger-exporter target/release/gpuledger-reclaimer

# The ledger: the combined binary.
FROM toolchain AS build-full
RUN cargo build --release --locked --bin gpuledger \
 && strip --strip-debug target/release/gpuledger

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/*
USER 65532:65532

FROM runtime AS exporter
COPY --from=build-lean /src/target/release/gpuledger-exporter /usr/local/bin/gpuledger-exporter
ENTRYPOINT ["/usr/local/bin/gpuledger-exporter"]
CMD ["--help"]

FROM runtime AS reclaimer
COPY --from=build-lean /src/target/release/gpuledger-reclaimer /usr/local/bin/gpuledger-reclaimer
ENTRYPOINT ["/usr/local/bin/gpuledger-reclaimer"]
CMD ["--help"]

FROM runtime AS aggregator
COPY --from=build-full /src/target/release/gpuledger /usr/local/bin/gpuledger
ENTRYPOINT ["/usr/local/bin/gpuledger"]
CMD ["--help"]
