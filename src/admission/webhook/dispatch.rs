//! What both dispatchers do for one webhook: call it, record the call, weigh a failure and its matchConditions.

use std::time::Duration;

use tracing::Instrument;

use super::review::{self, ReviewVersion};
use super::{CallError, Hook, WebhookClients};
use crate::admission::activation::{self, ExpressionAuthorizer, Invocation};
use crate::admission::matchconditions::{self, Matched};
use crate::admission::{Attributes, Error, Outcome};

/// Calls `hook` for `a` (after the dry-run check) and checks its answer. Warnings and audit annotations go to
/// `out` whatever the verdict.
pub(super) async fn call(
    clients: &WebhookClients,
    hook: &Hook,
    a: &Attributes,
    invocation: &Invocation<'_>,
    mutating: bool,
    out: &mut Outcome,
) -> Result<review::Answer, Error> {
    let calling = |source| Error::Calling { webhook: hook.name.clone(), source };
    if a.dry_run {
        match hook.side_effects.as_deref() {
            None => return Err(calling(CallError::SideEffectsUnset)),
            Some("None" | "NoneOnDryRun") => {}
            Some(_) => return Err(Error::DryRunUnsupported { webhook: hook.name.clone() }),
        }
    }
    let version = ReviewVersion::pick(&hook.review_versions).map_err(calling)?;
    let uid = uuid::Uuid::new_v4().to_string();
    let request = review::request(version, &uid, &invocation.attributes, a, invocation.object(), invocation.old());
    // k8s.io/apiserver's span for a webhook call; the call carries its context.
    let span = tracing::info_span!(
        "webhook",
        otel.name = if mutating { "Call mutating webhook" } else { "Call validating webhook" },
        configuration = %hook.configuration,
        webhook = %hook.name,
        resource = %format_args!("{}/{}, Resource={}", a.resource.group, a.resource.version, a.resource.resource),
        subresource = a.subresource.as_str(),
        operation = a.operation.as_str(),
        UID = %uid,
    );
    let body = clients.post(&hook.client_config, &request, hook.timeout).instrument(span).await.map_err(calling)?;
    let answer = review::answer(version, &uid, mutating, &body).map_err(calling)?;
    for (k, v) in &answer.audit_annotations {
        out.audit_annotations.insert(format!("{}/{k}", hook.name), v.clone());
    }
    out.warnings.extend(answer.warnings.iter().cloned());
    if !answer.allowed {
        return Err(Error::Denied { webhook: hook.name.clone(), status: answer.status });
    }
    Ok(answer)
}

/// Records one call of `hook` in `apiserver_admission_webhook_*`; `step` is `admit` or `validating`.
pub(super) fn observe(hook: &Hook, step: &str, a: &Attributes, took: Duration, error: Option<&Error>) {
    use crate::admission::metrics::{AdmissionRejectionLabels, AdmissionWebhookLabels};
    let m = crate::admission::metrics::metrics();
    let rejected = match error {
        None => false,
        Some(Error::Calling { .. }) => !hook.ignore_failures,
        Some(_) => true,
    };
    if let Some(e) = error.filter(|_| rejected) {
        let (error_type, code) = match e {
            Error::Calling { .. } => ("calling_webhook_error", 0),
            Error::Denied { status, .. } => ("no_error", crate::admission::denial_code(status.as_deref()).min(600)),
            _ => ("apiserver_internal_error", 0),
        };
        m.webhook_rejections
            .get_or_create(&AdmissionRejectionLabels {
                name: hook.name.clone(),
                r#type: step.to_owned(),
                operation: a.operation.as_str().to_owned(),
                error_type: error_type.to_owned(),
                rejection_code: code.to_string(),
            })
            .inc();
    }
    m.webhook_duration
        .get_or_create(&AdmissionWebhookLabels {
            name: hook.name.clone(),
            r#type: step.to_owned(),
            operation: a.operation.as_str().to_owned(),
            rejected: rejected.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// Whether a failure to call `hook` is let through (`failurePolicy: Ignore`), logged as kube-apiserver does.
pub(super) fn fails_open(hook: &Hook, e: &Error) -> bool {
    let open = hook.ignore_failures && matches!(e, Error::Calling { .. });
    if open {
        tracing::warn!(webhook = %hook.name, error = %e, "failed calling webhook, failing open");
    } else if matches!(e, Error::Calling { .. }) {
        tracing::warn!(webhook = %hook.name, error = %e, "failed calling webhook, failing closed");
    }
    open
}

/// Whether `hook`'s matchConditions let it be called for `invocation`, as the last step of k8s.io/apiserver's
/// `ShouldCallHook`: any false skips it; an error skips it under `failurePolicy: Ignore` and refuses the request
/// (403) under `Fail`. `kind` is the matcher's type label (`admit` or `validating`), `exclusion` the hook's own
/// (`admit` or `validate`): kube labels the two metrics differently.
pub(super) async fn conditions_hold(
    hook: &Hook,
    requested: &Attributes,
    invocation: &Invocation<'_>,
    authorizer: &ExpressionAuthorizer,
    (kind, exclusion): (&str, &str),
) -> Result<bool, Error> {
    if hook.match_conditions.is_empty() {
        return Ok(true);
    }
    let objects = (invocation.object(), invocation.old());
    let reads = hook.match_conditions.reads();
    let act = activation::activation(&invocation.attributes, requested, objects, authorizer, reads);
    let labels = |t: &str| crate::admission::metrics::MatchConditionLabels {
        name: hook.name.clone(),
        kind: "webhook".into(),
        r#type: t.to_owned(),
        operation: requested.operation.as_str().to_owned(),
    };
    let excluded = || {
        crate::admission::metrics::metrics().match_condition_exclusions.get_or_create(&labels(exclusion)).inc();
        Ok(false)
    };
    match matchconditions::evaluate(&hook.match_conditions, act, &labels(kind)).await {
        Matched::Yes => Ok(true),
        Matched::No(_) => excluded(),
        Matched::Error(_) if hook.ignore_failures => excluded(),
        Matched::Error(message) => {
            tracing::warn!(webhook = %hook.name, error = %message, "Failed evaluating match conditions, failing closed");
            Err(Error::MatchConditions { resource: requested.group_resource(), name: requested.name.clone(), message })
        }
    }
}
