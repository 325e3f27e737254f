//! Pairing codes for the person who will send tasks, and the QR code that carries one.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use crate::config::LoadedConfig;

/// A pairing code and the link that carries it.
#[derive(Clone, Debug, Serialize)]
pub struct Pairing {
    pub code: String,
    pub url: String,
    #[serde(rename = "expiresAt")]
    pub expires_at: String,
}

/// A pairing code for an agent: the live one if there is one, else a new one.
pub fn pairing(config: &LoadedConfig, agent: &str, ttl: Duration) -> anyhow::Result<Pairing> {
    let entry = config
        .config
        .agents
        .iter()
        .find(|a| a.name == agent)
        .with_context(|| format!("no agent {agent:?} in {}", config.path.display()))?;
    let mailbox = entry.mailbox_name().to_string();
    let email = config.mailbox_address(&mailbox)?;
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot create {}", config.state_dir.display()))?;
    let journal = crate::dispatch::Journal::open(&config.state().journal())?;
    let (code, expires) = match journal.fresh_pair_code(agent, Duration::from_secs(120))? {
        Some(live) => live,
        None => {
            let code = crate::dispatch::new_pair_code();
            let expires = journal.add_pair_code(agent, &code, ttl)?;
            (code, expires)
        }
    };
    Ok(Pairing {
        url: format!(
            "aamp://connect?mailbox={}&pair_code={}",
            crate::protocol::codec::encode_uri_component(&email),
            code
        ),
        code,
        expires_at: crate::protocol::time::format_utc(expires),
    })
}

/// The pairing link as a QR code for a terminal.
pub fn qr(url: &str) -> String {
    qrcode::QrCode::new(url.as_bytes())
        .map(|q| {
            q.render::<qrcode::render::unicode::Dense1x2>()
                .quiet_zone(true)
                .build()
        })
        .unwrap_or_default()
}
