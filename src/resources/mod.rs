//! The resources this server serves, each in a folder of its own: its types, versions and conversion, defaults,
//! validation, printer columns and OpenAPI schema.

pub mod podset;
