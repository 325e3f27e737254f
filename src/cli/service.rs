//! `aamp-bridge service`: the systemd user unit or launchd agent.

use crate::output::{out, outln};

use super::*;

pub(super) fn service(config_path: &std::path::Path, action: ServiceAction) -> anyhow::Result<i32> {
    use crate::service::{Kind, Service};
    // The service runs `start` with this config: it must load.
    let config = LoadedConfig::load(config_path)?;
    let launchd = matches!(action, ServiceAction::Render { launchd: true });
    let svc = Service::for_this_machine(&config.path, launchd)?;
    match action {
        ServiceAction::Render { .. } => out!("{}", svc.render()),
        ServiceAction::Install => {
            let changed = svc.install()?;
            if changed {
                outln!(
                    "installed {} (runs {} --config {})",
                    svc.file.display(),
                    svc.exe.display(),
                    svc.config.display()
                );
            } else {
                outln!("already installed, and enabled: {}", svc.file.display());
            }
            if svc.kind == Kind::Systemd {
                outln!("start it with `aamp-bridge service start`; to keep it running while you are logged out, as root: `loginctl enable-linger $USER`");
            } else {
                outln!("start it with `aamp-bridge service start`");
            }
        }
        ServiceAction::Uninstall => {
            if !svc.file.exists() && svc.packaged().is_some() {
                svc.uninstall()?;
                outln!(
                    "disabled and stopped the package's unit {} (it stays until the package is removed: apt-get remove aamp-bridge)",
                    svc.packaged().unwrap_or_default().display()
                );
            } else if svc.uninstall()? {
                outln!(
                    "removed {} (the config and the state directory stay)",
                    svc.file.display()
                );
            } else {
                outln!("no service was installed");
            }
        }
        ServiceAction::Start => svc.start()?,
        ServiceAction::Stop => svc.stop()?,
        ServiceAction::Reload => svc.reload()?,
        ServiceAction::Status { json } => {
            let problems = svc.problems();
            if json {
                let list: Vec<_> = problems
                    .iter()
                    .map(|(p, f)| serde_json::json!({"problem": p, "fix": f}))
                    .collect();
                outln!(
                    "{}",
                    serde_json::json!({"file": svc.effective_file().unwrap_or(svc.file.clone()),
                        "packaged": svc.packaged(), "ok": problems.is_empty(), "problems": list})
                );
            } else if problems.is_empty() {
                outln!(
                    "{} runs this binary with {}",
                    svc.effective_file().unwrap_or(svc.file.clone()).display(),
                    svc.config.display()
                );
                if svc.kind == Kind::Systemd {
                    let _ = std::process::Command::new("systemctl")
                        .args(["--user", "--no-pager", "status", "aamp-bridge.service"])
                        .status();
                }
            } else {
                for (problem, fix) in &problems {
                    outln!("{problem}\n  fix: {fix}");
                }
            }
            return Ok(if problems.is_empty() { 0 } else { 1 });
        }
        ServiceAction::Logs => {
            let status = match svc.kind {
                Kind::Systemd => std::process::Command::new("journalctl")
                    .args([
                        "--user",
                        "-u",
                        "aamp-bridge.service",
                        "-n",
                        "200",
                        "--no-pager",
                    ])
                    .status(),
                Kind::Launchd => std::process::Command::new("tail")
                    .args(["-n", "200"])
                    .arg(
                        std::path::Path::new(&std::env::var("HOME").unwrap_or_default())
                            .join("Library/Logs/aamp-bridge/aamp-bridge.log"),
                    )
                    .status(),
            };
            return Ok(status.map(|s| s.code().unwrap_or(1)).unwrap_or(1));
        }
    }
    Ok(0)
}
