use clap::Parser as _;

fn main() -> std::process::ExitCode {
    let cli = aamp_bridge::cli::Cli::parse();
    let start = matches!(cli.command, aamp_bridge::cli::Command::Start { .. });
    aamp_bridge::telemetry::init(start);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            aamp_bridge::cli::error_line(format_args!("cannot start the async runtime: {e}"));
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(aamp_bridge::cli::run(cli));
    // Work still running off the runtime (a file request an agent made on a file system that
    // does not answer) must not keep the process from exiting after a stop.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    aamp_bridge::telemetry::flush(std::time::Duration::from_secs(2));
    match result {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            aamp_bridge::cli::error_line(format_args!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}
