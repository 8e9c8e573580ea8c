//! The official client SDKs, installed on demand for the end-to-end tests:
//! a Python virtualenv under the target directory with the pinned
//! `tests/python/requirements.txt`, so `cargo test` needs no manual setup.
//! More Python SDKs are one more line in that file.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// A `python` command whose interpreter can import every package in
/// `tests/python/requirements.txt`. The first call in a test run installs
/// them (once per target directory, and again when the file changes).
pub fn python_with_sdks() -> Command {
    static PYTHON: OnceLock<Python> = OnceLock::new();
    let python = PYTHON.get_or_init(|| {
        let requirements =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/requirements.txt");
        let dir = target_dir().join("sdk-python");
        provision_python(&dir, &requirements).unwrap_or_else(|why| {
            panic!(
                "the SDK tests need python3 (with its venv module or pip) and access to PyPI, \
                 to install {} into {}: {why}",
                requirements.display(),
                dir.display()
            )
        })
    });
    let mut command = Command::new(&python.exe);
    if let Some(site) = &python.site {
        command.env("PYTHONPATH", site);
    }
    command
}

/// The directory of `module`, a package of `tests/python/requirements.txt`
/// (found without importing it, which would want its Python deps).
pub fn python_package_dir(module: &str) -> PathBuf {
    PathBuf::from(stdout_of(python_with_sdks().args([
        "-c",
        &format!(
            "import importlib.util, os; \
             print(os.path.dirname(importlib.util.find_spec('{module}').origin))"
        ),
    ])))
}

/// What `command` printed, trimmed; a failure fails the test with its
/// standard error.
pub fn stdout_of(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

struct Python {
    exe: PathBuf,
    /// Where the packages are when there is no virtualenv (`pip --target`).
    site: Option<PathBuf>,
}

fn provision_python(dir: &Path, requirements: &Path) -> Result<Python, String> {
    let wanted = std::fs::read(requirements).map_err(|e| e.to_string())?;
    let venv_python = dir.join("bin/python");
    let site = dir.join("site");
    let usable = || venv_python.is_file() || site.is_dir();
    provisioned(dir, &wanted, usable, || {
        let (mut pip, target) = match run(Command::new("python3").args(["-m", "venv"]).arg(dir)) {
            Ok(()) => (Command::new(&venv_python), None),
            // Some distributions ship python3 without venv (Debian's
            // python3-venv): then the system's own pip installs to a folder.
            Err(no_venv) => {
                let _ = std::fs::remove_dir_all(dir);
                run(Command::new("python3").args(["-m", "pip", "--version"]))
                    .map_err(|no_pip| format!("{no_venv}; {no_pip}"))?;
                (Command::new("python3"), Some(&site))
            }
        };
        pip.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(requirements);
        if let Some(site) = target {
            pip.arg("--target").arg(site);
        }
        run(&mut pip)
    })?;
    Ok(if venv_python.is_file() {
        Python {
            exe: venv_python,
            site: None,
        }
    } else {
        Python {
            exe: "python3".into(),
            site: Some(site),
        }
    })
}

/// Runs `install` into a fresh `dir` unless `dir` is `usable` and was made
/// from `wanted`, under a file lock: test binaries run in parallel and each
/// would otherwise install at once.
fn provisioned(
    dir: &Path,
    wanted: &[u8],
    usable: impl Fn() -> bool,
    install: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    let lock_path = dir.with_extension("lock");
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    let lock = File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    let stamp = dir.join("installed-from");
    if usable() && std::fs::read(&stamp).is_ok_and(|done| done == wanted) {
        return Ok(());
    }
    // A half-finished or outdated install is redone from scratch.
    let _ = std::fs::remove_dir_all(dir);
    install()?;
    std::fs::write(&stamp, wanted).map_err(|e| e.to_string())
}

fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    match command.output() {
        Ok(Output { status, .. }) if status.success() => Ok(()),
        Ok(Output { status, stderr, .. }) => Err(format!(
            "{shown} failed ({status}): {}",
            String::from_utf8_lossy(&stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {shown}: {e}")),
    }
}

/// Cargo's target directory (it marks its root with `CACHEDIR.TAG`), found
/// from this test binary's own path so `CARGO_TARGET_DIR` and
/// `--target-dir` are honoured.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .or_else(|| exe.parent())
        .map(Path::to_path_buf)
        .expect("the test binary is in a directory")
}

/// The executable `bin` of the npm package `spec` (`name@version`, pinned),
/// installed on first use with the machine's npm into a folder of its own
/// under `<target>/node-tools` (once per target directory, and again when
/// `spec` changes). npm's commands are Node scripts: `node` runs them.
pub fn node_package(spec: &str, bin: &str) -> PathBuf {
    let name: String = spec
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let dir = target_dir().join("node-tools").join(name.trim_matches('-'));
    let exe = dir.join("node_modules/.bin").join(bin);
    let install = || {
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        run(Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .arg("--prefix")
            .arg(&dir)
            .arg(spec))
    };
    provisioned(&dir, spec.as_bytes(), || exe.is_file(), install).unwrap_or_else(|why| {
        panic!(
            "this test needs Node.js with npm and access to the npm registry, \
             to install {spec} into {}: {why}",
            dir.display()
        )
    });
    exe
}

/// A `node` command running `tests/node/<script>` with the packages of
/// `tests/node/package-lock.json` importable. The first call in a test run
/// installs them with `npm ci` into `<target>/sdk-node` (once per target
/// directory, and again when the lock file changes); the script is copied
/// there on every call, as Node resolves a script's imports from its own
/// folder and nothing is installed in the source tree.
pub fn node_with_sdks(script: &str) -> Command {
    static NODE: OnceLock<PathBuf> = OnceLock::new();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    let dir = NODE.get_or_init(|| {
        let dir = target_dir().join("sdk-node");
        provision_node(&dir, &source).unwrap_or_else(|why| {
            panic!(
                "the Node SDK tests need Node.js 20 or later with npm (apt-get install nodejs npm) \
                 and access to the npm registry, to install {} into {}: {why}",
                source.join("package-lock.json").display(),
                dir.display()
            )
        });
        dir
    });
    // Written aside and renamed: a test binary running the same script at
    // once never reads a half-copied file.
    let copy = dir.join(script);
    let partial = dir.join(format!(".{script}.{}", std::process::id()));
    std::fs::copy(source.join(script), &partial)
        .and_then(|_| std::fs::rename(&partial, &copy))
        .unwrap_or_else(|e| panic!("copying tests/node/{script} to {}: {e}", copy.display()));
    let mut command = Command::new("node");
    command.arg(copy);
    command
}

fn provision_node(dir: &Path, source: &Path) -> Result<(), String> {
    let lock = source.join("package-lock.json");
    let wanted = std::fs::read(&lock).map_err(|e| format!("{}: {e}", lock.display()))?;
    let usable = || dir.join("node_modules").is_dir();
    provisioned(dir, &wanted, usable, || {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(source.join(file), dir.join(file))
                .map_err(|e| format!("{}: {e}", source.join(file).display()))?;
        }
        run(Command::new("node").arg("--version"))?;
        run(Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .arg("--prefix")
            .arg(dir))
    })
}

/// Clears the SDKs' own configuration from the environment (`ANTHROPIC_*`,
/// `OPENAI_*`: keys, base URLs, extra headers) so a check script talks to
/// the proxy with exactly what it passes.
pub fn sdk_env_cleared(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("ANTHROPIC_") || text.starts_with("OPENAI_") {
            command.env_remove(&name);
        }
    }
    command
}

/// Runs `command` (an SDK check script) against `proxy` at `base_url`, with
/// the SDKs' own environment cleared and `env` added, and fails with
/// everything the run printed unless it exited well and printed `passed`.
pub async fn run_sdk_check(
    mut command: Command,
    proxy: &super::Proxy,
    base_url: String,
    env: &[(&str, &str)],
    passed: &str,
) {
    sdk_env_cleared(&mut command)
        .env("AGENT_PROXY_BASE_URL", base_url)
        .envs(env.iter().copied());
    let output = tokio::task::spawn_blocking(move || command.output().expect("it runs"))
        .await
        .expect("the check ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(passed),
        "{passed:?} not printed\nstdout:\n{stdout}\nstderr:\n{stderr}\nproxy log:\n{}",
        proxy.logs()
    );
}
