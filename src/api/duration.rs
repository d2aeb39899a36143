//! Durations as Kubernetes writes them on the command line and in query parameters.

use std::time::Duration;

/// A Go-style duration as k8s.io/apiserver's flags and the `timeout` query parameter take it ("10s", "1m30s",
/// "500ms"), or plain seconds.
pub fn parse(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let d: jiff::SignedDuration = s.parse().map_err(|e| format!("{s:?} is not a duration like 10s or 1m: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} is negative"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_kubernetes_flags_write_them() {
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("7"), Ok(Duration::from_secs(7)));
        assert!(parse("-5s").is_err());
        assert!(parse("soon").is_err());
    }
}
