//! `podset-apiserver rotate-ca`: rotates the self-signed CA in the server's data directory, in two steps, so an
//! APIService that pins it never meets a certificate it does not trust. Run where the data is (`kubectl exec` into
//! the server's Pod: the image has no shell, and needs none for this). The bundle to pin goes to stdout, PEM.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::options::serving::{service_names, service_namespace};
use crate::apiserver::self_signed;

#[derive(Debug, Clone, Args)]
pub struct RotateCaOptions {
    /// The second step: serve a certificate of the staged CA, and make that CA the current one. Prints the new CA
    /// alone. Without a staged CA, one is made: a rotation in one step, for APIServices that do not pin the CA.
    #[arg(long)]
    pub finish: bool,

    /// The server's --data-dir (its certificates are under certs/ there).
    #[arg(long, default_value = "podset-data", env = "PODSET_DATA_DIR")]
    pub data_dir: PathBuf,

    /// The server's --cert-dir, if it sets one.
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,

    /// Namespace of the Services in front of the server, named by the new certificate (as the server's flag).
    #[arg(long, env = "POD_NAMESPACE")]
    pub service_namespace: Option<String>,
}

pub fn run(opts: RotateCaOptions) -> anyhow::Result<()> {
    let dir = opts.cert_dir.unwrap_or_else(|| opts.data_dir.join("certs"));
    let (pem, said) = if opts.finish {
        let hosts = service_names(&service_namespace(opts.service_namespace.as_deref()));
        let ca = self_signed::finish_rotation(&dir, &hosts)
            .with_context(|| format!("finishing the rotation in {}", dir.display()))?;
        (ca, "the new CA's certificate is served from now on (within a second); pin this CA alone")
    } else {
        let bundle =
            self_signed::stage_rotation(&dir).with_context(|| format!("staging a rotation in {}", dir.display()))?;
        (bundle, "a next CA is staged; pin this bundle (the current CA and the next), then run `rotate-ca --finish`")
    };
    std::io::stdout().write_all(pem.as_bytes()).context("writing the CA to stdout")?;
    eprintln!("rotate-ca: {said}");
    Ok(())
}
