//! The Python of the project's .venv, where the Makefile installs the clients the tests drive
//! (openai, grpcio, PyJWT): checked for what a test imports, and a script run to its end.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::root;

/// .venv's Python, once it imports `modules` (comma-separated, as `import` takes them);
/// `setup` names the make target that installs them.
pub fn venv_python(modules: &str, setup: &str) -> PathBuf {
    let python = root().join(".venv/bin/python");
    let imports = Command::new(&python)
        // Isolated: a folder of tests/ beside the working directory (tests/openai,
        // tests/grpc) would otherwise import as the package of its name.
        .args(["-I", "-c", &format!("import {modules}")])
        .status();
    assert!(
        imports.is_ok_and(|s| s.success()),
        "{} cannot import {modules}: run `make {setup}`",
        python.display()
    );
    python
}

/// Runs `script` (a path under the project) with `args`; panics, with its output, unless it
/// exits 0. What it printed, stdout then stderr.
pub fn run_script(python: &Path, script: &str, args: &[String]) -> String {
    let out = Command::new(python)
        .arg(root().join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} failed:\n{text}");
    text
}
