//! Cross-cutting request filters, each with one job, named after k8s.io/apiserver's `pkg/server/filters`:
//! `requestinfo` (the request's RequestInfo, worked out once, before the others), `maxinflight` (429 when too many
//! requests run at once) and `timeout` (504 when one runs too long). The last two leave long-running requests
//! (watches) alone, as kube-apiserver's `LongRunningFunc` says.

pub mod maxinflight;
pub mod requestinfo;
pub mod timeout;

pub use maxinflight::{InFlight, MaxInFlight, RequestKind};
pub use requestinfo::{info_of, RequestInfoLayer};
pub use timeout::RequestTimeoutLayer;
