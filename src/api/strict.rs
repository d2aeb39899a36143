//! Documents decoded strictly, as kube-apiserver decodes its configuration files and manifests: YAML or JSON, a
//! misspelt field an error naming its path rather than a setting silently left out.

use serde::de::DeserializeOwned;

/// `text` decoded as `T`; an unknown field is an error naming its path.
pub fn decode_strict<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    strictly(serde_yaml::Deserializer::from_str(text))
}

/// One document already read (a manifest file's, a list's item) decoded as `T`, strictly.
pub fn decode_strict_value<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, String> {
    strictly(value)
}

/// A JSON value decoded as `T`, strictly (an object a patch made, as kube-apiserver's strict JSON serializer reads
/// it).
pub fn decode_strict_json<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, String> {
    strictly(value)
}

fn strictly<'de, T: DeserializeOwned, D: serde::Deserializer<'de>>(d: D) -> Result<T, String>
where
    D::Error: std::fmt::Display,
{
    let mut unknown = Vec::new();
    let decoded: T =
        serde_ignored::deserialize(d, |p| unknown.push(format!("{:?}", field_path(&p)))).map_err(|e| e.to_string())?;
    if !unknown.is_empty() {
        return Err(format!("strict decoding error: unknown field {}", unknown.join(", unknown field ")));
    }
    Ok(decoded)
}

/// A field's path as kube reports it (`resources[0].providers[1].kms.pandas`).
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}
