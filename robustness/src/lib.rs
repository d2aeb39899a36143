//! Robustness as etcd tests itself, laid out as its `tests/robustness`: a [`model`] of what clients saw (the
//! recorded history), the [`traffic`] that makes it, the [`failpoint`]s injected meanwhile, the [`validate`] checks
//! (linearizability, the watch guarantees, read freshness, the controller's Pod counts) and the [`report`]. The
//! [`harness`] runs a real cluster: etcd, replicas of podset-apiserver behind kube-apiserver's aggregator; etcd's
//! own [`record`] of every change is the ground truth.

pub mod failpoint;
pub mod harness;
pub mod model;
pub mod record;
pub mod report;
pub mod traffic;
pub mod validate;

pub use model::history::History;
pub use report::Report;
pub use validate::check;
