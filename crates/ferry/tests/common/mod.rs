//! Helpers shared by the command-line tests: running the built `ferry`, checking its exit,
//! and incompressible test data.
#![allow(dead_code)] // Each test file uses its own subset.

use std::process::{Command, Output};

/// The password every command-line test repository is created with.
pub const PASSWORD: &str = "ferry-cli-test-password";

/// `ferry ARGS` with the test password and no repository from the environment.
pub fn ferry_command(args: &[&str]) -> Command {
    with_test_env(Command::new(env!("CARGO_BIN_EXE_ferry")), args)
}

/// `WRAPPER... FERRY ARGS` with [`ferry_command`]'s environment: `wrapper` (a program and
/// its arguments) is to run the path of `ferry` it gets next, with the arguments after it.
pub fn ferry_through(wrapper: &[&str], args: &[&str]) -> Command {
    let (program, wrapper_args) = wrapper.split_first().expect("a wrapper program");
    let mut cmd = Command::new(program);
    cmd.args(wrapper_args).arg(env!("CARGO_BIN_EXE_ferry"));
    with_test_env(cmd, args)
}

fn with_test_env(mut cmd: Command, args: &[&str]) -> Command {
    cmd.args(args)
        .env_remove("FERRY_REPO")
        .env_remove("FERRY_NEW_PASSWORD")
        .env("FERRY_PASSWORD", PASSWORD);
    cmd
}

/// Runs `ferry ARGS` to completion.
pub fn ferry(args: &[&str]) -> Output {
    ferry_command(args).output().expect("run ferry")
}

/// The command's stdout, after asserting it succeeded.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ferry failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

/// Incompressible bytes from a seed (xorshift), so every MiB is a MiB stored.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
