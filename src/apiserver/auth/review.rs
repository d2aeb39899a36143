//! Asking the main API server (TokenReview, SubjectAccessReview) without kube's long retry backoff: a request
//! waiting on the answer must not sit for minutes while the main API server answers 503.

use std::fmt::Debug;
use std::time::Duration;

use kube::api::PostParams;

use super::metrics::DelegatedReviews;

/// Why a review has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("refused ({code}): {message}")]
    Refused { code: u16, message: String },
    #[error("the main API server did not answer")]
    Timeout,
    #[error(transparent)]
    Client(#[from] kube::Error),
}

/// Creates a review (TokenReview, SubjectAccessReview) and returns the answer: three tries, each within `timeout`,
/// retrying what may pass (no answer, 429, 5xx). Each try is counted in `metrics` by the main API server's code
/// (`201`, or `<error>` when it did not answer), as k8s.io/apiserver's delegated authn/authz metrics.
pub async fn review<K>(
    api: &kube::Api<K>,
    review: &K,
    timeout: Duration,
    metrics: &DelegatedReviews,
) -> Result<K, ReviewError>
where
    K: kube::Resource + Clone + Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let mut delay = Duration::from_millis(100);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let last = attempt >= 3;
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(timeout, api.create(&PostParams::default(), review)).await;
        let code = match &answer {
            Ok(Ok(_)) => "201".to_owned(),
            Ok(Err(kube::Error::Api(e))) => e.code.to_string(),
            _ => "<error>".to_owned(),
        };
        metrics.observe(&code, started.elapsed());
        match answer {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(kube::Error::Api(e))) if (e.code < 500 && e.code != 429) || last => {
                return Err(ReviewError::Refused { code: e.code, message: e.message })
            }
            Ok(Err(e)) if last => return Err(e.into()),
            Err(_) if last => return Err(ReviewError::Timeout),
            _ => {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}
