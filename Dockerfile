# Ferry's image: the `ferry` binary at /ferry on a small glibc base. The node agent runs
# `/ferry agent`, and the pods holding exposed volumes run `/ferry hold` from the same image.
#
#   docker build -t ferry:latest .
#
# Stage 1: build the release binary with the versions pinned in Cargo.lock.
FROM rust:1.95-bookworm AS build
# cmake and clang: aws-lc-sys (the S3 client's TLS) builds C code.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ferry \
 && cp target/release/ferry /ferry

# Stage 2: distroless/cc has glibc, libgcc and CA certificates, no shell and no package manager.
FROM gcr.io/distroless/cc-debian12
COPY --from=build /ferry /ferry
ENTRYPOINT ["/ferry"]
CMD ["agent"]
