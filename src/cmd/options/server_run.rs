//! How the server treats requests and ends: k8s.io/apiserver's `ServerRunOptions` (in-flight limits, timeouts, the
//! shutdown delay), with its flag names and defaults.

use std::time::Duration;

use clap::Args;

use super::duration;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Generic server")]
pub struct ServerRunOptions {
    /// Most non-mutating requests (get, list) running at once; more are answered 429 with Retry-After. Watches do
    /// not count. 0: no limit.
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: usize,

    /// Most mutating requests (create, update, patch, delete) running at once; more are answered 429. 0: no limit.
    #[arg(long, default_value_t = 200)]
    pub max_mutating_requests_inflight: usize,

    /// A request (other than a watch) that has not answered in this long gets 504; a client's `?timeout=` can only
    /// shorten it.
    #[arg(long, default_value = "1m0s", value_parser = duration)]
    pub request_timeout: Duration,

    /// Seconds a watch without timeoutSeconds lasts at least; each runs a random time in [this, twice this) and then
    /// ends cleanly, so clients reconnect spread out.
    #[arg(long, default_value_t = 1800)]
    pub min_request_timeout: u64,

    /// After SIGTERM, keep serving this long with /readyz failing (its `shutdown` check), so that endpoints and
    /// load balancers stop sending requests here before connections are closed.
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub shutdown_delay_duration: Duration,
}

impl ServerRunOptions {
    pub fn min_request_timeout(&self) -> Duration {
        Duration::from_secs(self.min_request_timeout.max(1))
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.request_timeout.is_zero() {
            anyhow::bail!("--request-timeout must be more than 0");
        }
        Ok(())
    }
}
