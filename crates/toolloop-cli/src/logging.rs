//! Diagnostics on stderr through `tracing`: off but for warnings by default, `-v` (info), `-vv`
//! (debug), `-vvv` (trace); `RUST_LOG` sets the filter exactly when it is set.

use tracing_subscriber::EnvFilter;

/// Installs the subscriber for the command's lifetime.
pub fn init(verbose: u8) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => {
            EnvFilter::try_new(spec.trim()).unwrap_or_else(|e| {
                eprintln!("toolloop: RUST_LOG: {e}; logging warnings only");
                EnvFilter::new("warn")
            })
        }
        _ => EnvFilter::new(match verbose {
            0 => "warn",
            1 => "warn,toolloop=info,toolloop_store=info,toolloop_tools=info",
            2 => "info,toolloop=debug,toolloop_store=debug,toolloop_tools=debug",
            _ => "trace",
        }),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(verbose >= 2)
        .try_init();
}
