//! The binary's command line: flags grouped by concern (`options`), and `start`, which turns them into a running
//! server, as sample-apiserver's `pkg/cmd/server`.

mod backup;
mod check;
pub mod config_file;
pub mod encryption;
pub mod options;
mod restore;
mod rotate_ca;
mod start;
pub mod telemetry;

pub use backup::BackupOptions;
pub use check::CheckOptions;
pub use options::{Command, LogFormat, Options};
pub use restore::RestoreOptions;
pub use rotate_ca::RotateCaOptions;
pub use start::{run, run_with, Extra};

/// PodSets in `version`, as the tools that reach them through kube-apiserver (`backup`, `check`) name them.
fn podsets_in(version: crate::api::Version) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: crate::api::GROUP.into(),
        version: version.as_str().into(),
        api_version: version.api_version().into(),
        kind: crate::api::KIND.into(),
        plural: crate::api::PLURAL.into(),
    }
}

/// Logs, without traces (for the tools that share the server's flags).
pub fn init_logs(format: LogFormat) -> telemetry::Telemetry {
    telemetry::init(format, None, "info").expect("logs alone need no configuration")
}
