//! `turnpike-epp`: Turnpike's endpoint picker for the Gateway API Inference Extension, an
//! Envoy `ext_proc` server that tells the proxy which model server takes each request (see
//! the `picker` module of `turnpike-upstream`).

use std::path::PathBuf;

use clap::Parser;

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "turnpike-epp", version, about)]
struct Cli {
    /// The picker's settings (TOML).
    #[arg(long)]
    config: PathBuf,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let settings = match std::fs::read_to_string(&cli.config)
        .map_err(|e| format!("cannot read {}: {e}", cli.config.display()))
        .and_then(|text| turnpike_upstream::picker::Settings::parse(&text))
    {
        Ok(s) => s,
        Err(why) => {
            tracing::error!("{why}");
            return std::process::ExitCode::from(2);
        }
    };
    // One thread: a decision takes microseconds, and hand-offs between threads would cost
    // more than they save.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(turnpike_upstream::picker::serve(
        settings,
        |addr| {
            // The first line on stdout says where it listens (tests and scripts read it).
            #[allow(clippy::print_stdout)]
            {
                println!("turnpike-epp listening on {addr}");
            }
        },
        // SIGTERM (a pod's end) or SIGINT: stop taking streams, finish the open ones.
        async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        },
    ));
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
