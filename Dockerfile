# Ferry's image: the `ferry` binary at /ferry on a small glibc base. The node agent runs
# `/ferry agent`, and the pods holding exposed volumes run `/ferry hold` from the same image.
#
#   docker build -t ferry:latest .
#
# Stage 1: build the release binary with the versions pinned in Cargo.lock.
FROM rust:1.95-bookworm AS build
# The C code some crates build (ring for TLS, zstd) needs only the image's own C compiler.
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
