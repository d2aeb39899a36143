//! An apply configuration merged into an object as a mutating admission policy merges it (k8s.io/apiserver's
//! `policy/mutating/patch/smd.go`, `ApplyStructuredMergeDiff`): checked against the schema, refused when it sets
//! an atomic list, map or struct, then merged. The merge itself records no field ownership, as there.

use serde_json::Value;

use super::schema::Schema;
use super::typed::{find_atomics, merge_into, validate};
use crate::admission::mutation::gvk_text;

/// `patch` merged into `object` by `schema`, or why not in kube's words.
pub fn apply_configuration(schema: &Schema, object: &Value, patch: &Value) -> Result<Value, String> {
    let (patch_kind, object_kind) = (gvk_text(patch), gvk_text(object));
    if patch_kind != object_kind {
        return Err(format!("patch ({patch_kind}) and original object ({object_kind}) are not of the same gvk"));
    }
    validate(schema, patch).map_err(|e| format!("failed to convert patch object to typed object: {e}"))?;
    let atomics = find_atomics(schema, patch);
    if !atomics.is_empty() {
        return Err(format!(
            "invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: {}",
            atomics.join(", ")
        ));
    }
    // The object went through its type: only what the configuration sets needs walking.
    let mut merged = object.clone();
    merge_into(schema, &mut merged, patch).map_err(|e| format!("failed to merge patch: {e}"))?;
    Ok(merged)
}

#[cfg(test)]
mod tests;
