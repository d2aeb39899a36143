//! The model the checks read: a [`history::History`] of client calls, watches, etcd's changes and Pod counts.

pub mod history;
