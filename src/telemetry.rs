//! Logging: human-readable lines on stderr, filtered by `AAMP_BRIDGE_LOG` (or `RUST_LOG`).

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command};

pub fn init(cli: &Cli) {
    let default = match cli.command {
        Command::Start { .. } => "info",
        _ => "warn",
    };
    let filter = std::env::var("AAMP_BRIDGE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default.to_string());
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new(default)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
