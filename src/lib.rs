//! podset-apiserver: an aggregated Kubernetes API server for `PodSet` (`demo.k8s.io/v1alpha1`).
#![forbid(unsafe_code)]

pub mod admission;
pub mod api;
pub mod apiserver;
pub mod cel;
pub mod cmd;
pub mod controller;
pub mod metrics;
#[cfg(feature = "planted-bugs")]
pub mod planted;
pub mod registry;
pub mod resources;
pub mod storage;
pub mod trace;
pub mod version;
