//! A real control plane on one machine, like controller-runtime's envtest: etcd, kube-apiserver and
//! kube-controller-manager from a `KUBEBUILDER_ASSETS` directory, our server registered through
//! `deploy/base/apiservice.yaml`. Used by the end-to-end tests and by `podset-local-cluster`.
//!
//! It runs inside a private network, PID and mount namespace ([`namespace_command`]) so nothing leaves the machine
//! and nothing outlives it. kube-apiserver refuses Endpoints in 127.0.0.0/8, so our server listens on [`NODE_IP`],
//! an address that exists only on the namespace's loopback.
//!
//! Without a node (the default) Pods are created and stay `Pending`. [`Cluster::start_with_node`] adds one
//! ([`node`]: containerd, runc, CNI, kubelet, kube-scheduler, kube-proxy), so they run.
//!
//! kube-apiserver reaches our replicas at their endpoints (`--enable-aggregator-routing`), one picked per request;
//! [`Cluster::start_replicated_behind_cluster_ip`] has it reach them as in a real cluster instead, at the Service's
//! ClusterIP through kube-proxy, one picked per connection.
#![allow(clippy::missing_panics_doc)]

mod aggregation;
mod cluster;
pub mod etcd;
pub mod kms;
mod kubectl;
pub mod node;
pub mod otlp;
mod pki;
mod policy_api;
mod process;
mod replicas;
mod sandbox;

pub use cluster::{Cluster, Credential, ServerCommand};
pub use policy_api::{FrontRequest, PolicyApi};
pub use sandbox::{assets_dir, free_port, inside_namespace, namespace_command, reenter_namespace, INSIDE};

pub const NODE_IP: &str = "10.250.0.10";
/// Where each replica of podset-apiserver listens when several run ([`Cluster::start_replicated`]): the first is
/// [`NODE_IP`].
pub const REPLICA_IPS: [&str; 3] = [NODE_IP, "10.250.0.11", "10.250.0.12"];
const REPLICA_NAMES: [&str; 3] = ["podset-apiserver", "podset-apiserver-2", "podset-apiserver-3"];
/// Where each replica reaches kube-apiserver when several run: an address of its own, so a test can cut one
/// replica from the main API server alone (iptables on the destination).
pub const APISERVER_ROUTES: [&str; 3] = ["10.250.3.1", "10.250.3.2", "10.250.3.3"];

const NAMESPACE_YAML: &str = include_str!("../../deploy/base/namespace.yaml");
const APISERVICE_YAML: &str = include_str!("../../deploy/base/apiservice.yaml");
const RBAC_YAML: &str = include_str!("../../deploy/base/rbac.yaml");
/// Our server's identity in the main API server: the ServiceAccount deploy/base/rbac.yaml grants.
const CONTROLLER_USER: &str = "system:serviceaccount:podset-system:podset-apiserver";
