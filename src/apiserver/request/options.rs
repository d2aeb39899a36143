//! The options of a write or a delete, checked as kube-apiserver checks Create/Update/Patch/DeleteOptions: the
//! field manager (its length and the printable characters it may hold), dry run, field validation.

use http::{header, HeaderMap};

use super::query::Query;
use super::Verb;
use crate::api::validation::{ErrorType, FieldError};
use crate::api::UserInfo;
use crate::apiserver::error::{ApiError, ApiResult};
use crate::registry::{DeleteOptions, PatchType, WriteOptions};
/// kube-apiserver's limit on a field manager's length, in bytes.
const FIELD_MANAGER_MAX: usize = 128;

/// The options of a write, checked as kube-apiserver checks Create/Update/PatchOptions (422 naming the options
/// kind). The field manager is `fieldManager`, else the User-Agent's prefix; an apply must name it.
pub fn write_options(
    q: &Query,
    headers: &HeaderMap,
    verb: Verb,
    patch: Option<PatchType>,
    user: UserInfo,
    version: crate::api::resource::VersionIndex,
) -> ApiResult<WriteOptions> {
    let mut errors = Vec::new();
    if verb == Verb::Patch {
        if patch != Some(PatchType::Apply) && q.force.is_some() {
            errors.push(FieldError::forbidden("force", "may not be specified for non-apply patch"));
        }
        if patch == Some(PatchType::Apply) && q.field_manager.is_none() {
            errors.push(FieldError::required("fieldManager", "is required for apply patch"));
        }
    }
    if let Some(m) = q.field_manager.as_deref() {
        errors.extend(field_manager_errors(m));
    }
    if !errors.is_empty() {
        let kind = match verb {
            Verb::Create => "CreateOptions.meta.k8s.io",
            Verb::Update => "UpdateOptions.meta.k8s.io",
            _ => "PatchOptions.meta.k8s.io",
        };
        return Err(ApiError::invalid_kind(kind, "", &errors));
    }
    let agent = || headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
    Ok(WriteOptions {
        user,
        dry_run: q.dry_run,
        field_validation: q.field_validation,
        field_manager: q.field_manager.clone().unwrap_or_else(|| prefix_from_user_agent(agent())),
        field_manager_named: q.field_manager.is_some(),
        force: q.force.unwrap_or(false),
        version: Some(version),
    })
}

/// apimachinery's `ValidateFieldManager`: at most 128 bytes, printable characters only.
pub(super) fn field_manager_errors(m: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if m.len() > FIELD_MANAGER_MAX {
        errors.push(FieldError {
            field: "fieldManager".into(),
            kind: ErrorType::TooLong,
            value: None,
            detail: format!("must have at most {FIELD_MANAGER_MAX} bytes"),
        });
    }
    for (i, c) in m.char_indices().filter(|(_, c)| !is_printable(*c)) {
        errors.push(FieldError::invalid(
            "fieldManager",
            m,
            format!("invalid character U+{:04X} (at position {i})", c as u32),
        ));
    }
    errors
}

/// kube-apiserver's `prefixFromUserAgent`: the User-Agent up to its first `/`, printable characters only, cut to
/// 128 bytes.
pub(super) fn prefix_from_user_agent(agent: &str) -> String {
    let mut out = String::new();
    for c in agent.split('/').next().unwrap_or("").chars().filter(|c| is_printable(*c)) {
        if out.len() + c.len_utf8() > FIELD_MANAGER_MAX {
            break;
        }
        out.push(c);
    }
    out
}

/// Go's `unicode.IsPrint`, without Unicode's tables: no control or format characters, no space but U+0020, no
/// private use. (Unassigned code points pass here; Go refuses them too.)
fn is_printable(c: char) -> bool {
    const FORMAT: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),
        (0x0600, 0x0605),
        (0x061C, 0x061C),
        (0x06DD, 0x06DD),
        (0x070F, 0x070F),
        (0x0890, 0x0891),
        (0x08E2, 0x08E2),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x202A, 0x202E),
        (0x2060, 0x2064),
        (0x2066, 0x206F),
        (0xFEFF, 0xFEFF),
        (0xFFF9, 0xFFFB),
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    ];
    let private_use = matches!(c, '\u{E000}'..='\u{F8FF}' | '\u{F0000}'..='\u{10FFFF}');
    let cp = c as u32;
    c == ' '
        || !(c.is_control()
            || c.is_whitespace()
            || private_use
            || FORMAT.iter().any(|(lo, hi)| (*lo..=*hi).contains(&cp)))
}

/// DeleteOptions from the body (if any), overridden by query parameters.
pub fn delete_options(q: &Query, body: &[u8]) -> ApiResult<DeleteOptions> {
    let mut opts: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        // `null` is no options, as kube-apiserver reads it.
        serde_json::from_slice::<Option<DeleteOptions>>(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
            .unwrap_or_default()
    };
    if q.propagation_policy.is_some() {
        opts.propagation_policy = q.propagation_policy.clone();
    }
    if q.orphan_dependents.is_some() {
        opts.orphan_dependents = q.orphan_dependents;
    }
    if q.grace_period_seconds.is_some() {
        opts.grace_period_seconds = q.grace_period_seconds;
    }
    Ok(opts)
}
