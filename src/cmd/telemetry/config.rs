//! `--tracing-config-file`: an `apiserver.config.k8s.io` `TracingConfiguration` (v1, v1beta1 or v1alpha1, the same
//! fields), read and checked as kube-apiserver reads it (component-base's `tracing/api/v1`): the OTLP/gRPC
//! collector's endpoint and how many spans in a million are sampled.

use std::path::Path;

use serde::Deserialize;

use crate::api::validation::FieldError;
use crate::cmd::config_file::{aggregate, decode_strict};

pub const GROUP: &str = "apiserver.config.k8s.io";
pub const KIND: &str = "TracingConfiguration";
const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];

/// The collector when the file names none: OTLP/gRPC's default.
pub const DEFAULT_ENDPOINT: &str = "localhost:4317";

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TracingConfiguration {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    api_version: String,
    /// host:port (`dns:` scheme, the default), or `unix:` / `unix-abstract:` socket; no TLS, as kube's.
    pub endpoint: Option<String>,
    /// Spans sampled in a million, when the caller has not decided; unset or 0 samples only what a trusted
    /// caller's sampled `traceparent` asks for.
    pub sampling_rate_per_million: Option<i32>,
}

/// Where the exporter connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// host:port.
    Tcp(String),
    /// A unix socket's path (a leading NUL for an abstract one).
    Unix(String),
}

impl TracingConfiguration {
    /// Reads and checks `path`; errors say the file and the reason, in kube-apiserver's words.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("failed to read tracing config: open {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("--tracing-config-file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let decoding = |e: &dyn std::fmt::Display| {
            format!("failed to read tracing config: unable to decode tracing configuration data: {e}")
        };
        let config: Self = decode_strict(text).map_err(|e| decoding(&e))?;
        if config.kind.is_empty() {
            return Err(decoding(&"Object 'Kind' is missing"));
        }
        let version = config.api_version.strip_prefix(GROUP).and_then(|v| v.strip_prefix('/'));
        if config.kind != KIND || !version.is_some_and(|v| VERSIONS.contains(&v)) {
            return Err(decoding(&format!(
                "no kind {:?} is registered for version {:?} (expected kind {KIND}, apiVersion {GROUP}/v1)",
                config.kind, config.api_version
            )));
        }
        let errors = config.validate();
        if !errors.is_empty() {
            return Err(format!("failed to validate tracing configuration: {}", aggregate(&errors)));
        }
        Ok(config)
    }

    fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        match self.sampling_rate_per_million {
            Some(rate) if rate < 0 => {
                errors.push(FieldError::invalid("samplingRatePerMillion", rate, "sampling rate must be positive"))
            }
            Some(rate) if rate > 1_000_000 => errors.push(FieldError::invalid(
                "samplingRatePerMillion",
                rate,
                "sampling rate per million must be less than or equal to one million",
            )),
            _ => {}
        }
        if let Some(endpoint) = &self.endpoint {
            if let Err(detail) = parse_endpoint(endpoint) {
                errors.push(FieldError::invalid("endpoint", endpoint, detail));
            }
        }
        errors
    }

    /// The share of traces sampled when no trusted caller decided: 0 to 1.
    pub fn sampling_ratio(&self) -> f64 {
        f64::from(self.sampling_rate_per_million.unwrap_or(0).max(0)) / 1e6
    }

    pub fn endpoint(&self) -> Endpoint {
        parse_endpoint(self.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT)).expect("checked when loaded")
    }
}

/// An endpoint as gRPC names them (grpc/doc/naming.md), with kube's rule: no `//` means `dns://`.
fn parse_endpoint(endpoint: &str) -> Result<Endpoint, String> {
    let lowered;
    let (scheme, rest) = match endpoint.split_once(':').filter(|_| endpoint.contains("//")) {
        Some((scheme, rest)) => {
            lowered = scheme.to_ascii_lowercase();
            (lowered.as_str(), rest)
        }
        None if endpoint.starts_with("unix:") => ("unix", &endpoint["unix:".len()..]),
        None if endpoint.starts_with("unix-abstract:") => ("unix-abstract", &endpoint["unix-abstract:".len()..]),
        None => ("dns", endpoint),
    };
    let unsupported = || {
        format!(
            "unsupported scheme: {scheme}.  Options are none, dns, unix, or unix-abstract.  See \
             https://github.com/grpc/grpc/blob/master/doc/naming.md"
        )
    };
    match scheme {
        // dns:[//authority/]host[:port]
        "dns" => {
            let target = match rest.strip_prefix("//") {
                Some(with_authority) => with_authority.split_once('/').map_or("", |(_, target)| target),
                None => rest,
            };
            match target {
                "" => Err(format!("missing host in endpoint {endpoint:?}")),
                t if t.contains(':') => Ok(Endpoint::Tcp(t.to_owned())),
                t => Ok(Endpoint::Tcp(format!("{t}:443"))),
            }
        }
        "unix" => match rest.trim_start_matches("//") {
            "" => Err(format!("missing path in endpoint {endpoint:?}")),
            path => Ok(Endpoint::Unix(path.to_owned())),
        },
        "unix-abstract" => Ok(Endpoint::Unix(format!("\0{}", rest.trim_start_matches("//")))),
        _ => Err(unsupported()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(body: &str) -> String {
        format!("apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\n{body}")
    }

    #[test]
    fn every_version_kube_reads_and_its_defaults() {
        for v in VERSIONS {
            let c = TracingConfiguration::parse(&format!("apiVersion: {GROUP}/{v}\nkind: {KIND}\n")).unwrap();
            assert_eq!((c.endpoint(), c.sampling_ratio()), (Endpoint::Tcp(DEFAULT_ENDPOINT.into()), 0.0));
        }
        let c = TracingConfiguration::parse(&file("endpoint: otel.monitoring:4317\nsamplingRatePerMillion: 250\n"))
            .unwrap();
        assert_eq!((c.endpoint(), c.sampling_ratio()), (Endpoint::Tcp("otel.monitoring:4317".into()), 0.00025));
    }

    #[test]
    fn endpoints_as_grpc_names_them() {
        for (endpoint, want) in [
            ("collector:4317", Endpoint::Tcp("collector:4317".into())),
            ("dns:///collector:4317", Endpoint::Tcp("collector:4317".into())),
            ("DNS:///collector:4317", Endpoint::Tcp("collector:4317".into())),
            ("dns://8.8.8.8/collector:4317", Endpoint::Tcp("collector:4317".into())),
            ("collector", Endpoint::Tcp("collector:443".into())),
            ("unix:///run/otel.sock", Endpoint::Unix("/run/otel.sock".into())),
            ("unix:/run/otel.sock", Endpoint::Unix("/run/otel.sock".into())),
            ("unix-abstract:otel", Endpoint::Unix("\0otel".into())),
        ] {
            assert_eq!(parse_endpoint(endpoint), Ok(want), "{endpoint}");
        }
    }

    #[test]
    fn errors_name_the_field_as_kube_apiserver_does() {
        for (body, want) in [
            (
                "samplingRatePerMillion: -10\n",
                "failed to validate tracing configuration: samplingRatePerMillion: Invalid value: -10: sampling rate \
                 must be positive",
            ),
            (
                "samplingRatePerMillion: 1000001\n",
                "samplingRatePerMillion: Invalid value: 1000001: sampling rate per million must be less than or \
                 equal to one million",
            ),
            (
                "endpoint: https://collector:4318\n",
                "endpoint: Invalid value: \"https://collector:4318\": unsupported scheme: https.  Options are none, \
                 dns, unix, or unix-abstract.",
            ),
            ("samplingRate: 10\n", "strict decoding error: unknown field \"samplingRate\""),
        ] {
            let err = TracingConfiguration::parse(&file(body)).unwrap_err();
            assert!(err.contains(want), "{body}: {err}");
        }
        let err = TracingConfiguration::parse("apiVersion: v1\nkind: TracingConfiguration\n").unwrap_err();
        assert!(err.contains("no kind \"TracingConfiguration\" is registered for version \"v1\""), "{err}");
        let err = TracingConfiguration::parse("endpoint: x:1\n").unwrap_err();
        assert!(err.contains("Object 'Kind' is missing"), "{err}");
    }
}
