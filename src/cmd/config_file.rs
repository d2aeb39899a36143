//! A configuration file is a typed document, decoded as kube-apiserver decodes its own (EncryptionConfiguration,
//! TracingConfiguration): YAML or JSON, strictly (since 1.31 a misspelt field is an error, not a setting silently
//! left out), and its problems reported with kube's field paths.

use serde::de::DeserializeOwned;

use crate::api::validation::FieldError;

/// `text` decoded as `T`; an unknown field is an error naming its path.
pub fn decode_strict<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut unknown = Vec::new();
    let decoded: T = serde_ignored::deserialize(serde_yaml::Deserializer::from_str(text), |p| {
        unknown.push(format!("{:?}", field_path(&p)))
    })
    .map_err(|e| e.to_string())?;
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

/// Several errors as one, as Go's `utilerrors.NewAggregate` prints them.
pub fn aggregate(errors: &[FieldError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => format!("[{}]", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    }
}
