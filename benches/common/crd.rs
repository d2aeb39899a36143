//! The baseline: kube-apiserver 1.20 + etcd from the test assets (envtest's local control plane, inside the private
//! namespace `reenter_namespace` makes) serving PodSet as a CRD.

use std::time::Duration;

use podset_envtest::{Cluster, ServerCommand};

use super::workload::Target;

pub const CRD_GROUP: &str = "demo.example.com";

/// PodSet as a CRD in a group of its own (a CRD cannot share ours, and `*.k8s.io` needs API approval), with our
/// printer columns so its Table has the same cells; spec and status keep unknown fields rather than repeating the
/// whole Pod template schema.
const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podsets.demo.example.com}
spec:
  group: demo.example.com
  scope: Namespaced
  names: {plural: podsets, singular: podset, kind: PodSet, shortNames: [ps]}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Desired, type: integer, jsonPath: .spec.replicas}
    - {name: Current, type: integer, jsonPath: .status.replicas}
    - {name: Ready, type: integer, jsonPath: .status.readyReplicas}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// Starts the local control plane (our server, `PODSET_APISERVER_BIN` or this build, registered in it as usual),
/// installs the CRD and the namespace `bench`, and waits until PodSets of the CRD are served: the cluster, and the
/// CRD's PodSets in `bench`, reached through kube-apiserver as the admin.
pub async fn start() -> (Cluster, Target) {
    let bin = std::env::var("PODSET_APISERVER_BIN").unwrap_or_else(|_| super::BIN.to_owned());
    let cluster = Cluster::start(ServerCommand { program: bin.into(), args: Vec::new() });
    cluster.apply_text("crd.yaml", CRD);
    cluster.kubectl(&["create", "namespace", "bench"]);
    cluster.wait_for("the CRD to be served", Duration::from_secs(60), |c| {
        c.kubectl_try(&["get", &format!("podsets.{CRD_GROUP}"), "-n", "bench"]).is_ok()
    });
    let target = Target {
        path: format!("/apis/{CRD_GROUP}/v1alpha1/namespaces/bench/podsets"),
        api_version: "demo.example.com/v1alpha1",
        clients: vec![cluster.client().await],
    };
    (cluster, target)
}
