//! A configuration file is a typed document, decoded as kube-apiserver decodes its own (EncryptionConfiguration,
//! TracingConfiguration): YAML or JSON, strictly (since 1.31 a misspelt field is an error, not a setting silently
//! left out), and its problems reported with kube's field paths.

use crate::api::validation::FieldError;

pub use crate::api::strict::decode_strict;

/// Several errors as one, as Go's `utilerrors.NewAggregate` prints them.
pub fn aggregate(errors: &[FieldError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => format!("[{}]", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    }
}
