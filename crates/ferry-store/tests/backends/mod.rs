//! Per-backend fixtures, contract runs and backend-specific tests.

mod faulty;
mod fs;
mod memory;
mod s3;
