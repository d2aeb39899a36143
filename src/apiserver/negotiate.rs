//! Content negotiation: which representation a client asked for in `Accept`, and how a body is encoded.

use super::error::{ApiError, ApiResult};

/// A representation of an object or list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    Yaml,
    /// `meta.k8s.io/v1` Table.
    Table,
    /// `meta.k8s.io/v1` PartialObjectMetadata(List).
    Metadata,
    /// `apidiscovery.k8s.io` APIGroupDiscoveryList; the version (`v2` or `v2beta1`) the client asked for.
    Discovery(&'static str),
}

/// What an endpoint can produce besides plain JSON and YAML.
#[derive(Debug, Clone, Copy)]
pub struct Offers {
    pub table_and_metadata: bool,
    pub discovery: bool,
}

pub const OBJECTS: Offers = Offers { table_and_metadata: true, discovery: false };
pub const PLAIN: Offers = Offers { table_and_metadata: false, discovery: false };
pub const APIS: Offers = Offers { table_and_metadata: false, discovery: true };

struct MediaRange<'a> {
    essence: String,
    params: Vec<(String, &'a str)>,
    q: f32,
}

fn parse_accept(accept: &str) -> Vec<MediaRange<'_>> {
    let mut ranges: Vec<MediaRange> = accept
        .split(',')
        .filter_map(|part| {
            let mut it = part.split(';');
            let essence = it.next()?.trim().to_ascii_lowercase();
            if essence.is_empty() {
                return None;
            }
            let mut q = 1.0;
            let mut params = Vec::new();
            for p in it {
                let Some((k, v)) = p.split_once('=') else {
                    continue;
                };
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"'));
                if k == "q" {
                    q = v.parse().unwrap_or(0.0);
                } else {
                    params.push((k, v));
                }
            }
            Some(MediaRange { essence, params, q })
        })
        .collect();
    // As goautoneg orders them for k8s.io/apiserver: higher weight first, then a concrete type before `*`, then
    // a concrete subtype before `*`; stable, so equals keep the client's order.
    let wild = |r: &MediaRange| {
        let (t, sub) = r.essence.split_once('/').unwrap_or((&r.essence, ""));
        (t == "*", sub == "*")
    };
    ranges.sort_by(|a, b| b.q.total_cmp(&a.q).then_with(|| wild(a).cmp(&wild(b))));
    ranges
}

/// Picks the first acceptable representation of the ordered `Accept` list, or 406 when none is. A range with
/// `q=0` is tried last rather than refused, as kube-apiserver does.
pub fn negotiate(accept: Option<&str>, offers: Offers) -> ApiResult<Output> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Output::Json);
    };
    for r in parse_accept(accept) {
        let param = |name: &str| r.params.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        let json_like = matches!(r.essence.as_str(), "application/json" | "application/*" | "*/*");
        match (param("as"), param("g"), param("v")) {
            (None, _, _) => {
                if json_like {
                    return Ok(Output::Json);
                }
                if r.essence == "application/yaml" {
                    return Ok(Output::Yaml);
                }
            }
            (Some("Table"), Some("meta.k8s.io"), Some("v1" | "v1beta1"))
                if offers.table_and_metadata && r.essence == "application/json" =>
            {
                return Ok(Output::Table)
            }
            (
                Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                Some("meta.k8s.io"),
                Some("v1" | "v1beta1"),
            ) if offers.table_and_metadata && r.essence == "application/json" => return Ok(Output::Metadata),
            (Some("APIGroupDiscoveryList"), Some("apidiscovery.k8s.io"), Some(v @ ("v2" | "v2beta1")))
                if offers.discovery && r.essence == "application/json" =>
            {
                return Ok(Output::Discovery(if v == "v2" { "v2" } else { "v2beta1" }));
            }
            _ => {}
        }
    }
    Err(ApiError::not_acceptable())
}

/// How a request body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    Json,
    Yaml,
    MergePatch,
    JsonPatch,
    StrategicMergePatch,
    ApplyPatch,
}

pub fn body_format(content_type: Option<&str>) -> ApiResult<BodyFormat> {
    let raw = content_type.unwrap_or("");
    let essence = raw.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    Ok(match essence.as_str() {
        "application/json" | "" => BodyFormat::Json,
        "application/yaml" | "application/x-yaml" | "text/yaml" => BodyFormat::Yaml,
        "application/merge-patch+json" => BodyFormat::MergePatch,
        "application/json-patch+json" => BodyFormat::JsonPatch,
        "application/strategic-merge-patch+json" => BodyFormat::StrategicMergePatch,
        "application/apply-patch+yaml" => BodyFormat::ApplyPatch,
        _ => return Err(ApiError::unsupported_media_type(raw)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_and_client_go_accept_headers() {
        let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(negotiate(Some(table), OBJECTS).unwrap(), Output::Table);
        assert_eq!(negotiate(Some(table), PLAIN).unwrap(), Output::Json);
        let meta = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
        assert_eq!(negotiate(Some(meta), OBJECTS).unwrap(), Output::Metadata);
        let proto = "application/vnd.kubernetes.protobuf, */*";
        assert_eq!(negotiate(Some(proto), OBJECTS).unwrap(), Output::Json);
        let disco = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(negotiate(Some(disco), APIS).unwrap(), Output::Discovery("v2"));
        assert_eq!(negotiate(Some(disco), PLAIN).unwrap(), Output::Json);
        assert_eq!(negotiate(Some("application/yaml"), OBJECTS).unwrap(), Output::Yaml);
        assert_eq!(negotiate(None, OBJECTS).unwrap(), Output::Json);
    }

    #[test]
    fn weights_then_concrete_types_decide_and_cbor_clients_fall_back_to_json() {
        assert_eq!(negotiate(Some("application/json;q=0.5, application/yaml"), OBJECTS).unwrap(), Output::Yaml);
        assert_eq!(negotiate(Some("*/*;q=0.9, application/yaml;q=0.9"), OBJECTS).unwrap(), Output::Yaml);
        assert_eq!(negotiate(Some("application/cbor, application/json"), OBJECTS).unwrap(), Output::Json);
        assert_eq!(negotiate(Some("application/cbor-seq;q=1, application/json;q=0.9"), OBJECTS).unwrap(), Output::Json);
        assert_eq!(negotiate(Some("application/yaml;q=0, text/html"), OBJECTS).unwrap(), Output::Yaml);
        let e = negotiate(Some("application/cbor"), OBJECTS).unwrap_err();
        assert_eq!(e.code(), 406);
        assert_eq!(e.status.message, "only the following media types are accepted: application/json, application/yaml");
    }

    #[test]
    fn nothing_acceptable_is_406() {
        for accept in
            ["application/vnd.kubernetes.protobuf", "text/html", "application/json;as=Table;g=meta.k8s.io;v=v9"]
        {
            assert_eq!(negotiate(Some(accept), OBJECTS).unwrap_err().code(), 406, "{accept}");
        }
    }

    #[test]
    fn body_formats() {
        assert_eq!(body_format(Some("application/json; charset=utf-8")).unwrap(), BodyFormat::Json);
        assert_eq!(body_format(Some("application/merge-patch+json")).unwrap(), BodyFormat::MergePatch);
        for ct in
            ["text/plain", "application/cbor", "application/vnd.kubernetes.protobuf", "application/apply-patch+cbor"]
        {
            let e = body_format(Some(ct)).unwrap_err();
            assert_eq!((e.code(), e.reason()), (415, "UnsupportedMediaType"), "{ct}");
        }
    }
}
