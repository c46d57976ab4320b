//! The Python tools the suites run (schemathesis, checkov), at the versions
//! `scripts/setup.sh` pins and installs, each in a virtualenv of its own under
//! `${XDG_CACHE_HOME:-~/.cache}/seckill/<package>-<version>/`.

use std::path::PathBuf;

use crate::stack::workspace_root;

/// The executable `bin` of the pinned `package` (whose version `scripts/setup.sh` sets
/// as `<VERSION_VAR>=...`), or the path in the environment variable `override_var`.
///
/// # Panics
/// When `scripts/setup.sh` pins no such version, or the tool is not installed (the
/// message says to run `scripts/setup.sh`).
pub fn tool(package: &str, version_var: &str, bin: &str, override_var: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(override_var) {
        return PathBuf::from(path);
    }
    let setup = std::fs::read_to_string(workspace_root().join("scripts/setup.sh"))
        .expect("scripts/setup.sh");
    let prefix = format!("{version_var}=");
    let version = setup
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("scripts/setup.sh pins no {version_var}"))
        .trim()
        .to_string();
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME");
    let path = cache.join(format!("seckill/{package}-{version}/bin/{bin}"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup.sh (it installs {package} {version})",
        path.display()
    );
    path
}
