//! Files the tests take from PyPI packages (the only models and reference
//! texts this project may download): a package is fetched once with pip into
//! the test cache, and the members the tests need are kept there.

use std::path::{Path, PathBuf};
use std::process::Command;

use convert::ConvertError;

/// The download cache: the runtime's cache folder
/// ([`hamburger::engine::calibration::cache_dir`]), else `hamburger` in the
/// temporary folder.
pub fn cache_dir() -> PathBuf {
    hamburger::engine::calibration::cache_dir().unwrap_or_else(|| std::env::temp_dir().join("hamburger"))
}

/// The Python the tests' helper scripts run with: the test environment
/// `.venv-tests` at the workspace's root, which `scripts/install-deps.sh`
/// makes (the openai client, jinja2: Debian's own Python refuses pip
/// installs outside a virtual environment), else `python3`.
pub fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-tests/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// The PyPI source distribution of llama-cpp-python, whose vendored llama.cpp
/// carries the chat templates of well-known models (`models/templates/`).
pub const LLAMA_CPP_PYTHON_SDIST: &str = "llama-cpp-python==0.3.36";

/// Downloads `spec` (a pip requirement, source distributions only when
/// `sdist`) into a new folder under `cache` and returns the file pip saved.
///
/// # Errors
/// When pip is missing or fails, or saved no file ending in `ext`.
pub fn pip_download(
    cache: &Path,
    spec: &str,
    sdist: bool,
    ext: &str,
) -> Result<(tempfile::TempDir, PathBuf), ConvertError> {
    std::fs::create_dir_all(cache).map_err(|e| ConvertError::io(cache, e))?;
    let dl = tempfile::tempdir_in(cache).map_err(|e| ConvertError::io(cache, e))?;
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "download", "--quiet", "--no-deps", "-d"]).arg(dl.path());
    if sdist {
        // The package's source alone: the build tools pip sets up to read its
        // metadata may come as wheels (`:all:` built them from source too, minutes).
        let name = spec.split(['=', '<', '>', '!', '~', ' ']).next().unwrap_or(spec);
        pip.args(["--no-binary", name]);
    }
    let status = pip.arg(spec).status().map_err(|e| ConvertError::io("python3", e))?;
    let file = std::fs::read_dir(dl.path())
        .map_err(|e| ConvertError::io(dl.path(), e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(ext));
    match (status.success(), file) {
        (true, Some(f)) => Ok((dl, f)),
        _ => Err(ConvertError::Checkpoint { path: cache.into(), msg: format!("`pip download {spec}` failed") }),
    }
}

/// The folder of chat templates (`*.jinja`, named after their models) that
/// llama.cpp's sources carry, taken from [`LLAMA_CPP_PYTHON_SDIST`] on first use.
///
/// # Errors
/// When the download or the extraction fails.
pub fn llama_cpp_templates() -> Result<PathBuf, ConvertError> {
    let cache = cache_dir();
    let out = cache.join(format!("templates-{}", LLAMA_CPP_PYTHON_SDIST.replace("==", "-")));
    if out.is_dir() {
        return Ok(out);
    }
    let (dl, sdist) = pip_download(&cache, LLAMA_CPP_PYTHON_SDIST, true, ".tar.gz")?;
    let unpacked = dl.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).map_err(|e| ConvertError::io(&unpacked, e))?;
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&sdist)
        .arg("-C")
        .arg(&unpacked)
        .args(["--wildcards", "*/vendor/llama.cpp/models/templates/*.jinja"])
        .status()
        .map_err(|e| ConvertError::io("tar", e))?;
    let root = std::fs::read_dir(&unpacked).ok().and_then(|mut d| d.next()).and_then(Result::ok).map(|e| e.path());
    let (true, Some(root)) = (status.success(), root) else {
        return Err(ConvertError::Checkpoint { path: sdist, msg: "no templates in the source distribution".into() });
    };
    let templates = root.join("vendor/llama.cpp/models/templates");
    std::fs::rename(&templates, &out).map_err(|e| ConvertError::io(&out, e))?;
    Ok(out)
}
