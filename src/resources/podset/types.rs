use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ListMeta, ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::selector::Selector;

/// PodSet keeps `spec.replicas` identical Pods, made from `spec.template`, running in its namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(
    rename = "io.k8s.demo.v1alpha1.PodSet",
    extend("x-kubernetes-group-version-kind" = [{"group": "demo.k8s.io", "version": "v1alpha1", "kind": "PodSet"}])
)]
pub struct PodSet {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Standard object's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The desired state: how many Pods, which ones, made from what.
    #[serde(default)]
    pub spec: PodSetSpec,
    /// The observed state, written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodSetStatus>,
}

/// PodSetSpec is the desired state of a PodSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.demo.v1alpha1.PodSetSpec")]
pub struct PodSetSpec {
    /// Replicas is the number of desired Pods. Defaults to 1; must be 0 or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Selector is a label query over Pods that should match the replica count. Defaults to the template's labels;
    /// it must match them, and it cannot change after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Template is the object that describes the Pod that will be created if insufficient replicas are detected.
    /// Defaults to a busybox container running `sleep 3600`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateSpec>,
    /// MinReadySeconds is how long a new Pod must be ready, without any of its containers crashing, before it
    /// counts as available. Defaults to 0 (available as soon as it is ready). New in v1beta1.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub min_ready_seconds: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// PodSetStatus is the most recently observed state of a PodSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.demo.v1alpha1.PodSetStatus")]
pub struct PodSetStatus {
    /// Replicas is the number of Pods that are owned, not terminating, and Pending or Running.
    #[serde(default)]
    pub replicas: i32,
    /// ReadyReplicas is the number of those Pods with a Ready condition.
    #[serde(default)]
    pub ready_replicas: i32,
    /// AvailableReplicas is the number of those Pods that have been ready for at least `spec.minReadySeconds`.
    #[serde(default)]
    pub available_replicas: i32,
    /// FullyLabeledReplicas is the number of those Pods whose labels hold every label of the Pod template.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fully_labeled_replicas: i32,
    /// TerminatingReplicas is the number of this PodSet's Pods being deleted and not yet Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminating_replicas: Option<i32>,
    /// PodNames lists the counted Pods, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_names: Vec<String>,
    /// ObservedGeneration is the most recent generation of the spec the controller has acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions describe the latest observations, e.g. ReplicaFailure when Pods cannot be created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// PodSetList is a list of PodSets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(
    rename = "io.k8s.demo.v1alpha1.PodSetList",
    extend("x-kubernetes-group-version-kind" = [{"group": "demo.k8s.io", "version": "v1alpha1", "kind": "PodSetList"}])
)]
pub struct PodSetList {
    /// APIVersion defines the versioned schema of this representation of an object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Kind is a string value representing the REST resource this object represents.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Standard list metadata.
    #[serde(default)]
    pub metadata: ListMeta,
    /// Items is the list of PodSets.
    pub items: Vec<PodSet>,
}

impl PodSet {
    /// The Pods `spec.selector` selects; `None` when it is unset or malformed (validation refuses both).
    pub fn selector(&self) -> Option<Selector> {
        self.spec.selector.as_ref().and_then(|s| Selector::from_label_selector(s).ok())
    }
}

impl kube::Resource for PodSet {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        super::KIND.into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        super::GROUP.into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        super::VERSION.into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        super::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
