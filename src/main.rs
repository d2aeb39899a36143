use clap::Parser;
use podset_apiserver::cmd::{init_tracing, run, Options};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    init_tracing(opts.log_format);
    run(opts).await
}
