//! What every resource shares: request attributes, label and field selectors, durations, strict decoding, field
//! errors and the validation of object metadata, Table parts. PodSet's own types live in `crate::resources::podset`;
//! the re-exports below keep the paths the rest of the code still uses until it reads them from there.

pub mod duration;
pub mod openapi;
pub mod request;
pub mod resource;
pub mod selector;
pub mod strict;
pub mod table;
pub mod validation;

pub use request::{Operation, Subresource, UserInfo};

pub use crate::resources::podset::{conversion, defaults, schema};
pub use crate::resources::podset::{
    PodSet, PodSetList, PodSetSpec, PodSetStatus, Version, API_VERSION, CATEGORIES, DEFAULT_LABEL, GROUP,
    GROUP_RESOURCE, KIND, LIST_KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION,
};
