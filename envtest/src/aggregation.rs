//! podset-apiserver registered with kube-apiserver's aggregator as deploy/ does it: deploy/base/apiservice.yaml's
//! APIServices, one per version, each naming a Service. The Services here have no selector; their Endpoints are
//! written, listing the replicas whose build serves every version routed to the Service, as deploy/'s selectors
//! pick only the Pods of such a build.

use std::time::Duration;

use serde::Deserialize;

use crate::{Cluster, APISERVICE_YAML, REPLICA_IPS};

/// One APIService of deploy/base/apiservice.yaml.
struct ApiService {
    version: String,
    /// The Service in podset-system it sends requests to.
    service: String,
    doc: serde_yaml::Value,
}

fn apiservices() -> Vec<ApiService> {
    serde_yaml::Deserializer::from_str(APISERVICE_YAML)
        .map(|doc| {
            let doc = serde_yaml::Value::deserialize(doc).expect("deploy/base/apiservice.yaml");
            let version = doc["spec"]["version"].as_str().expect("spec.version").to_owned();
            let service = doc["spec"]["service"]["name"].as_str().expect("spec.service.name").to_owned();
            ApiService { version, service, doc }
        })
        .collect()
}

/// The Services the APIServices name, each once.
pub(crate) fn services() -> Vec<String> {
    let mut services: Vec<String> = apiservices().into_iter().map(|a| a.service).collect();
    services.sort_unstable();
    services.dedup();
    services
}

/// The versions this build serves: deploy/base/apiservice.yaml registers each.
pub(crate) fn all_versions() -> Vec<String> {
    apiservices().into_iter().map(|a| a.version).collect()
}

fn apiservice_name(version: &str) -> String {
    format!("{version}.demo.k8s.io")
}

impl Cluster {
    /// Registers what every replica's build serves (all the same at start), and waits until it is Available and
    /// proxied.
    pub(crate) fn register(&mut self) {
        let versions = self.replica_versions.first().cloned().unwrap_or_default();
        self.register_versions(&versions);
    }

    /// Registers `version` as deploy/base/apiservice.yaml does, as `kubectl apply -k` of a release that adds it:
    /// its Service (created if new; its Endpoints the ready replicas whose build serves it) and its APIService with
    /// our CA; returns once kube-apiserver reports it Available and proxies it.
    pub fn register_version(&mut self, version: &str) {
        self.register_versions(&[version.to_owned()]);
    }

    fn register_versions(&mut self, versions: &[String]) {
        let port = self.podset_addr.port();
        let wanted: Vec<ApiService> = apiservices().into_iter().filter(|a| versions.contains(&a.version)).collect();
        assert_eq!(wanted.len(), versions.len(), "deploy/base/apiservice.yaml registers {versions:?}");
        self.registered.extend(versions.iter().cloned());
        let mut services: Vec<&str> = wanted.iter().map(|a| a.service.as_str()).collect();
        services.sort_unstable();
        services.dedup();
        let services: Vec<String> = services
            .iter()
            .map(|name| {
                format!(
                    "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: podset-system\nspec:\n  ports:\n  - name: https\n    port: 443\n    targetPort: {port}\n"
                )
            })
            .collect();
        self.apply_text("services.yaml", &services.join("---\n"));
        self.write_endpoints();
        // With the caBundle an overlay would add.
        let docs: Vec<String> = wanted
            .into_iter()
            .map(|mut a| {
                a.doc["spec"]["caBundle"] = self.pki.b64("podset-ca.crt").into();
                serde_yaml::to_string(&a.doc).expect("YAML")
            })
            .collect();
        self.apply_text("apiservices.yaml", &docs.join("---\n"));
        let names: Vec<&str> = versions.iter().map(String::as_str).collect();
        self.wait_for(
            &format!("the APIServices {names:?} of demo.k8s.io to be Available"),
            Duration::from_secs(120),
            |c| c.apiservices_available(&names),
        );
        // Available comes from one controller, the proxy route from another: wait until requests get through.
        self.wait_for("kube-apiserver to proxy demo.k8s.io", Duration::from_secs(60), |c| {
            names.iter().all(|v| c.kubectl_try(&["get", "--raw", &format!("/apis/demo.k8s.io/{v}")]).is_ok())
        });
    }

    /// Takes `version` away as a rollback to a build without it must, before the last replica serving it goes:
    /// `kubectl delete apiservice`, then its Service and Endpoints unless another version's APIService names them.
    /// An APIService left without a server fails discovery, and every namespace deletion in the cluster stalls.
    pub fn unregister_version(&mut self, version: &str) {
        self.kubectl(&["delete", "apiservice", &apiservice_name(version)]);
        self.registered.retain(|v| v != version);
        let all = apiservices();
        let service = &all.iter().find(|a| a.version == version).expect("deploy/base/apiservice.yaml").service;
        if !all.iter().any(|a| &a.service == service && self.registered.contains(&a.version)) {
            let (svc, ep) = (format!("service/{service}"), format!("endpoints/{service}"));
            self.kubectl(&["delete", "-n", "podset-system", &svc, &ep, "--ignore-not-found"]);
        }
    }

    /// Registers `version` of another `group` the cluster's servers serve (a test's second kind) as deploy/'s
    /// APIServices register demo.k8s.io's: through the Service of demo.k8s.io's oldest version, whose Endpoints
    /// this cluster keeps, with our CA. Returns once kube-apiserver reports it Available and proxies it.
    pub fn register_group_version(&self, group: &str, version: &str) {
        let service = &apiservices()[0].service;
        let doc = format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: {version}.{group}\nspec:\n  \
             group: {group}\n  version: {version}\n  groupPriorityMinimum: 1000\n  versionPriority: 15\n  service:\n    \
             name: {service}\n    namespace: podset-system\n    port: 443\n  caBundle: {}\n",
            self.pki.b64("podset-ca.crt")
        );
        self.apply_text(&format!("apiservice-{version}.{group}.yaml"), &doc);
        let name = format!("{version}.{group}");
        self.wait_for(&format!("the APIService {name} to be Available"), Duration::from_secs(120), |c| {
            c.apiservice_named_available(&name)
        });
        self.wait_for(&format!("kube-apiserver to proxy {group}"), Duration::from_secs(60), |c| {
            c.kubectl_try(&["get", "--raw", &format!("/apis/{group}/{version}")]).is_ok()
        });
    }

    fn apiservice_named_available(&self, name: &str) -> bool {
        let available = "jsonpath={.status.conditions[?(@.type==\"Available\")].status}";
        self.kubectl_try(&["get", "apiservice", name, "-o", available]).is_ok_and(|s| s == "True")
    }

    /// The versions registered with the aggregator.
    pub fn registered_versions(&self) -> &[String] {
        &self.registered
    }

    /// Whether kube-apiserver reports these versions' APIServices `Available`.
    pub fn apiservices_available(&self, versions: &[&str]) -> bool {
        versions.iter().all(|v| self.apiservice_named_available(&apiservice_name(v)))
    }

    /// Whether kube-apiserver reports our APIServices (one per version) `Available`.
    pub fn apiservice_available(&self) -> bool {
        let all = all_versions();
        self.apiservices_available(&all.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Lists only these replicas in the Services' Endpoints (the others as not ready), as the endpoints controller
    /// does once a pod fails its readiness probe; a Service's Endpoints name only replicas whose build serves every
    /// version routed to it. Behind a ClusterIP ([`Self::start_replicated_behind_cluster_ip`]), returns once
    /// kube-proxy routes new connections to exactly those.
    pub fn set_ready_replicas(&self, ready: &[usize]) {
        *self.ready.lock().unwrap() = ready.to_vec();
        self.write_endpoints();
    }

    fn write_endpoints(&self) {
        let port = self.podset_addr.port();
        let ready = self.ready.lock().unwrap().clone();
        let all = apiservices();
        let mut services: Vec<&str> =
            all.iter().filter(|a| self.registered.contains(&a.version)).map(|a| a.service.as_str()).collect();
        services.sort_unstable();
        services.dedup();
        let mut routes = Vec::new();
        let docs: Vec<String> = services
            .into_iter()
            .map(|service| {
                let versions: Vec<&str> = all
                    .iter()
                    .filter(|a| a.service == service && self.registered.contains(&a.version))
                    .map(|a| a.version.as_str())
                    .collect();
                let serving: Vec<usize> = (0..self.replicas)
                    .filter(|&i| versions.iter().all(|v| self.replica_versions[i].iter().any(|s| s == v)))
                    .collect();
                let list = |want: bool| -> String {
                    serving
                        .iter()
                        .filter(|i| ready.contains(i) == want)
                        .map(|&i| format!("\n    - ip: {}", REPLICA_IPS[i]))
                        .collect()
                };
                routes.push((service, serving.iter().copied().filter(|i| ready.contains(i)).collect::<Vec<_>>()));
                let (up, down) = (list(true), list(false));
                let mut subset = String::new();
                if !up.is_empty() {
                    subset.push_str(&format!("\n    addresses:{up}"));
                }
                if !down.is_empty() {
                    subset.push_str(&format!("\n    notReadyAddresses:{down}"));
                }
                // A subset needs an address; no replica of the build: no subset.
                let subsets = if subset.is_empty() {
                    " []".to_owned()
                } else {
                    format!("\n  - ports:\n    - name: https\n      port: {port}{subset}")
                };
                format!(
                    "apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: {service}\n  namespace: podset-system\nsubsets:{subsets}\n"
                )
            })
            .collect();
        if !docs.is_empty() {
            self.apply_text("endpoints-ready.yaml", &docs.join("---\n"));
        }
        if self.cluster_ip_routing {
            // Until kube-proxy has synced, new connections may still go to a replica just taken out.
            for (service, want) in routes {
                self.wait_for(
                    &format!("kube-proxy to route {service} to replicas {want:?}"),
                    Duration::from_secs(30),
                    |_| Self::routed_replicas(service) == want,
                );
            }
        }
    }
}
