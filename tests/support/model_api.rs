//! The model stand-in (`tests/hosts/model_api.py`) as the agents' provider API: started on a
//! free port with its files in a folder of its own, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Child;

pub struct ModelApi {
    child: Child,
    pub url: String,
    dir: tempfile::TempDir,
}

impl ModelApi {
    pub fn start() -> ModelApi {
        ModelApi::start_with(&[])
    }

    /// Started with more flags, each naming a file in the stand-in's folder
    /// (`("--ledger", "ledger.jsonl")`): read them with [`ModelApi::file`].
    pub fn start_with(files: &[(&str, &str)]) -> ModelApi {
        let dir = tempfile::tempdir().unwrap();
        let mut args: Vec<std::ffi::OsString> = vec![
            "--port".into(),
            "0".into(),
            "--record".into(),
            dir.path().join("record.jsonl").into(),
        ];
        for (flag, name) in files {
            args.push(flag.into());
            args.push(dir.path().join(name).into());
        }
        let (child, port) = super::spawn_test_server("model_api.py", &args);
        ModelApi {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    /// A file of the stand-in's folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A Codex home under `home` (`.codex`) whose config names the stand-in as the model
    /// provider (Codex reads no base-URL variable), with no retries of its own.
    pub fn codex_home(&self, home: &Path) -> PathBuf {
        let codex_home = home.join(".codex");
        std::fs::create_dir_all(&codex_home).unwrap();
        std::fs::write(
            codex_home.join("config.toml"),
            format!(
                "model = \"gpt-5.5\"\nmodel_provider = \"standin\"\n[model_providers.standin]\nname = \"standin\"\nbase_url = \"{}/v1\"\nenv_key = \"CODEX_API_KEY\"\nwire_api = \"responses\"\nrequest_max_retries = 0\nstream_max_retries = 0\n",
                self.url
            ),
        )
        .unwrap();
        codex_home
    }
}

impl Drop for ModelApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
