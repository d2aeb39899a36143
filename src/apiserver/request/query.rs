//! The query options kube-apiserver understands, parsed and checked.

use crate::api::validation::FieldError;
use crate::apiserver::error::{ApiError, ApiResult};
use crate::registry::{FieldValidation, Revision};

#[derive(Debug, Clone, Default)]
pub struct Query {
    pub watch: bool,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    pub field_manager: Option<String>,
    pub force: Option<bool>,
    pub propagation_policy: Option<String>,
    pub grace_period_seconds: Option<i64>,
    pub orphan_dependents: Option<bool>,
    pub include_object: IncludeObject,
    pub pretty: bool,
}

/// What a Table row carries besides its cells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    #[default]
    Metadata,
    Object,
}

pub(super) fn parse_bool(name: &str, v: &str) -> ApiResult<bool> {
    match v {
        "true" | "1" | "True" | "TRUE" | "t" | "T" => Ok(true),
        "false" | "0" | "False" | "FALSE" | "f" | "F" | "" => Ok(false),
        _ => Err(ApiError::bad_request(format!("invalid value {v:?} for query parameter {name}: must be a boolean"))),
    }
}

pub(super) fn parse_int<T: std::str::FromStr>(name: &str, v: &str) -> ApiResult<T> {
    v.parse().map_err(|_| {
        ApiError::bad_request(format!("invalid value {v:?} for query parameter {name}: must be an integer"))
    })
}

impl Query {
    /// The first value of a repeated parameter counts, as in kube-apiserver (and in authorization).
    pub fn parse(raw: Option<&str>) -> ApiResult<Self> {
        let mut q = Query::default();
        let mut seen = std::collections::HashSet::new();
        for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            if !seen.insert(k.clone()) {
                continue;
            }
            let v = v.as_ref();
            match k.as_ref() {
                // kube-apiserver's conversion: only "0" and "false" (any case) are false.
                "watch" => q.watch = !(v == "0" || v.eq_ignore_ascii_case("false")),
                "resourceVersion" => q.resource_version = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "resourceVersionMatch" => q.resource_version_match = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "limit" => q.limit = Some(parse_int::<i64>("limit", v)?).filter(|l| *l > 0).map(|l| l as usize),
                "continue" => q.continue_token = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "labelSelector" => q.label_selector = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "fieldSelector" => q.field_selector = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "timeoutSeconds" => q.timeout_seconds = Some(parse_int("timeoutSeconds", v)?),
                "allowWatchBookmarks" => q.allow_watch_bookmarks = parse_bool("allowWatchBookmarks", v)?,
                "sendInitialEvents" => q.send_initial_events = Some(parse_bool("sendInitialEvents", v)?),
                "dryRun" => match v {
                    "All" => q.dry_run = true,
                    "" => {}
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "Invalid dry run value: {other:?}; supported values are: \"All\""
                        )))
                    }
                },
                "fieldValidation" => {
                    q.field_validation = match v {
                        "Ignore" => FieldValidation::Ignore,
                        "Warn" | "" => FieldValidation::Warn,
                        "Strict" => FieldValidation::Strict,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\", got {other:?}"
                            )))
                        }
                    }
                }
                "fieldManager" => q.field_manager = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "force" => q.force = Some(parse_bool("force", v)?),
                "propagationPolicy" => q.propagation_policy = Some(v.to_owned()).filter(|s| !s.is_empty()),
                "gracePeriodSeconds" => q.grace_period_seconds = Some(parse_int("gracePeriodSeconds", v)?),
                "orphanDependents" => q.orphan_dependents = Some(parse_bool("orphanDependents", v)?),
                "includeObject" => {
                    q.include_object = match v {
                        "None" => IncludeObject::None,
                        "Metadata" | "" => IncludeObject::Metadata,
                        "Object" => IncludeObject::Object,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "includeObject must be one of None, Metadata or Object, got {other:?}"
                            )))
                        }
                    }
                }
                "pretty" => q.pretty = parse_bool("pretty", v)?,
                _ => {}
            }
        }
        Ok(q)
    }

    /// k8s.io/apimachinery's `ValidateListOptions`: how `resourceVersionMatch` goes with the other options, for a
    /// list and for a watch; 422 naming every problem.
    pub fn check_list_options(&self, watch: bool) -> ApiResult<()> {
        const FIELD: &str = "resourceVersionMatch";
        let m = self.resource_version_match.as_deref();
        let mut errors = Vec::new();
        if watch {
            if self.send_initial_events.is_some() {
                if m != Some("NotOlderThan") {
                    errors.push(FieldError::forbidden(
                        FIELD,
                        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    ));
                }
                if self.send_initial_events == Some(true) && !self.allow_watch_bookmarks {
                    errors.push(FieldError::forbidden(
                        "allowWatchBookmarks",
                        "sendInitialEvents requires setting allowWatchBookmarks to true",
                    ));
                }
            }
            if let Some(m) = m {
                if self.send_initial_events.is_none() {
                    errors.push(FieldError::forbidden(
                        FIELD,
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    ));
                }
                if m != "NotOlderThan" {
                    errors.push(FieldError::not_supported(FIELD, m, &["NotOlderThan"]));
                }
            }
        } else if let Some(m) = m {
            if self.resource_version.is_none() {
                errors.push(FieldError::forbidden(
                    FIELD,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if self.continue_token.is_some() {
                errors
                    .push(FieldError::forbidden(FIELD, "resourceVersionMatch is forbidden when continue is provided"));
            }
            if m != "Exact" && m != "NotOlderThan" {
                errors.push(FieldError::not_supported(FIELD, m, &["Exact", "NotOlderThan", ""]));
            }
            if m == "Exact" && self.resource_version.as_deref() == Some("0") {
                errors.push(FieldError::forbidden(
                    FIELD,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(ApiError::invalid_kind("ListOptions.meta.k8s.io", "", &errors)),
        }
    }

    /// The resourceVersion as a revision (`None` when unset); "0" is a valid revision here.
    pub fn revision(&self) -> ApiResult<Option<Revision>> {
        self.resource_version
            .as_deref()
            .map(|rv| rv.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}"))))
            .transpose()
    }
}
