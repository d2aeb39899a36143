use clap::Parser;
use podset_apiserver::cmd::telemetry::{self, TracingConfiguration};
use podset_apiserver::cmd::{run, Command, Options};

/// jemalloc instead of glibc's malloc: a request allocates and frees many small and mid-sized buffers, which glibc
/// serves with bin consolidation on the request path (about a quarter of the server's CPU per create).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// One arena (two cores do not contend for it, and fewer arenas hold fewer idle pages), and freed pages go back to
/// the system within a second, from a background thread rather than on the request path. Threads cache blocks up to
/// 4 KiB (a PodSet's JSON is 1-2 KiB), not 32 KiB: the larger classes cached by each of the server's threads (tokio,
/// sled's I/O pool) held about 8 MB at 10k PodSets, for no CPU measurably saved.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] =
    b"background_thread:true,narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0,tcache_max:4096\0";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    let tracing = opts.tracing_config_file.as_deref().map(TracingConfiguration::load).transpose()?;
    // `check` prints its own findings: the client's log of the failures it reports would only repeat them.
    let default_filter = match opts.command {
        Some(Command::Check(_)) => "warn,kube_client=off",
        _ => "info",
    };
    let _telemetry = telemetry::init(opts.log_format, tracing.as_ref(), default_filter)?;
    run(opts).await
}
