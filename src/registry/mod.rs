//! PodSet semantics between the HTTP layer and storage.

pub mod fieldmanager;
