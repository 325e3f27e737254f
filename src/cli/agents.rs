//! `aamp-bridge agents`: the agents found on this machine, with versions and login state.

use crate::output::{errln, outln};

use super::*;

pub(super) async fn agents(
    config_path: &std::path::Path,
    json: bool,
    probe: bool,
) -> anyhow::Result<i32> {
    use crate::runner::{acp, profile::ProfileKind, scan, Profile};
    // The config is optional here: without one, every profile is listed as not configured.
    let config = if config_path.exists() {
        Some(LoadedConfig::load(config_path)?)
    } else {
        None
    };
    let profile_dirs = match &config {
        Some(c) => c.profile_dirs(),
        None => vec![crate::config::default_config_dir().join("profiles")],
    };
    let (profiles, errors) = Profile::all(&profile_dirs);
    for e in &errors {
        errln!("warning: {e}");
    }
    let configured = config
        .as_ref()
        .map(crate::runner::scan::agent_profiles)
        .unwrap_or_default();
    let bin_dirs = scan::bin_dirs().await;
    let mut found = scan::scan(&profiles, &configured, &bin_dirs).await;
    if probe {
        let scratch = std::env::temp_dir();
        for (d, p) in found.iter_mut().zip(&profiles) {
            if d.path.is_some() && p.kind == ProfileKind::Acp {
                d.probe = Some(
                    acp::probe(p, &scratch, false)
                        .await
                        .map_err(|e| e.to_string()),
                );
            }
        }
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&found)?);
        return Ok(0);
    }
    outln!(
        "{:<14} {:<4} {:<18} {:<10} DETAILS",
        "PROFILE",
        "KIND",
        "COMMAND",
        "STATUS"
    );
    for d in &found {
        let status = if d.path.is_some() {
            "installed"
        } else {
            "missing"
        };
        let mut details = Vec::new();
        if let Some(v) = &d.version {
            details.push(v.clone());
        }
        if let Some(p) = &d.path {
            details.push(p.display().to_string());
        } else if let Some(i) = &d.install {
            details.push(format!("install: {i}"));
        }
        if let Some(login) = &d.login {
            details.push(login.to_string());
        }
        if !d.configured.is_empty() {
            details.push(format!("used by {}", d.configured.join(", ")));
        }
        match &d.probe {
            Some(Ok(info)) => details.push(format!(
                "ACP ok: {}",
                info.agent.as_deref().unwrap_or("unnamed agent")
            )),
            Some(Err(e)) => details.push(format!("ACP probe failed: {e}")),
            None => {}
        }
        for w in &d.warnings {
            details.push(format!("warning: {w}"));
        }
        outln!(
            "{:<14} {:<4} {:<18} {:<10} {}",
            d.profile,
            d.kind,
            d.command,
            status,
            details.join("; ")
        );
    }
    Ok(0)
}
