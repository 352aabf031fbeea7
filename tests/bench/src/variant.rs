//! Measurement-only builds of the filter: the same crate with a cargo feature that stops a
//! request after one phase (`phase-plan-only`: planned, then let through undecided), built
//! into a target directory of its own so `make build`'s module is never one of them.

use std::path::PathBuf;
use std::process::Command;

use e2e::root;

/// Builds the filter with `feature` into `target/<feature>/` and returns the module's path.
/// Cargo rebuilds only what changed, so after the first run this takes a second.
pub fn build(feature: &str) -> PathBuf {
    let target_dir = root().join("target").join(feature);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(root())
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip1",
            "-p",
            "ratelimit-filter",
            "--features",
            feature,
            "--target-dir",
        ])
        .arg(&target_dir)
        .output()
        .unwrap_or_else(|e| panic!("run cargo to build the filter with {feature}: {e}"));
    assert!(
        output.status.success(),
        "building the filter with feature {feature} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let wasm = target_dir.join("wasm32-wasip1/release/ratelimit_filter.wasm");
    assert!(
        wasm.exists(),
        "{} is missing after the build",
        wasm.display()
    );
    wasm
}
