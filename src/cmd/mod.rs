//! The binary's command line: flags grouped by concern (`options`), and `start`, which turns them into a running
//! server, as sample-apiserver's `pkg/cmd/server`.

mod backup;
pub mod encryption;
pub mod options;
mod restore;
mod start;

pub use backup::BackupOptions;
pub use options::{Command, LogFormat, Options};
pub use restore::RestoreOptions;
pub use start::run;

pub fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
