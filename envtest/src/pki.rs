//! The cluster's certificates and keys, made in process: its CA, kube-apiserver's and the node's identities, the
//! front proxy's CA, and podset-apiserver's serving CA.

use std::path::{Path, PathBuf};

use base64::Engine;
use podset_apiserver::apiserver::tls::make_ca;
use rcgen::{
    CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SanType,
    PKCS_ECDSA_P256_SHA256,
};

use crate::{node, APISERVER_ROUTES, CONTROLLER_USER, NODE_IP, REPLICA_IPS};

pub(crate) struct Pki {
    pub(crate) dir: PathBuf,
}

fn leaf(issuer: &Issuer<'_, &KeyPair>, cn: &str, orgs: &[&str], sans: &[&str], server: bool) -> (String, String) {
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, cn);
    for o in orgs {
        p.distinguished_name.push(DnType::OrganizationName, *o);
    }
    p.subject_alt_names = sans
        .iter()
        .map(|s| match s.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(s.to_string().try_into().unwrap()),
        })
        .collect();
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    p.extended_key_usages =
        vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    pub(crate) fn make(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let write = |name: &str, pem: &str| std::fs::write(dir.join(name), pem).unwrap();
        let (ca_pem, ca_key, ca_params) = make_ca("kubernetes-ca").unwrap();
        write("ca.crt", &ca_pem);
        write("ca.key", &ca_key.serialize_pem());
        let ca = Issuer::new(ca_params, &ca_key);
        let (c, k) = leaf(
            &ca,
            "kube-apiserver",
            &[],
            &[
                "127.0.0.1",
                NODE_IP,
                APISERVER_ROUTES[0],
                APISERVER_ROUTES[1],
                APISERVER_ROUTES[2],
                "10.96.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
            true,
        );
        write("apiserver.crt", &c);
        write("apiserver.key", &k);
        let (c, k) = leaf(&ca, "admin", &["system:masters"], &[], false);
        write("admin.crt", &c);
        write("admin.key", &k);
        let (c, k) =
            leaf(&ca, CONTROLLER_USER, &["system:serviceaccounts", "system:serviceaccounts:podset-system"], &[], false);
        write("controller.crt", &c);
        write("controller.key", &k);

        // A node's components, as kubeadm names them (RBAC binds these names by default; the kubelet's group is
        // what the Node authorizer knows).
        for (file, cn, orgs) in [
            ("kubelet", format!("system:node:{}", node::NODE_NAME), &["system:nodes"][..]),
            ("scheduler", "system:kube-scheduler".to_owned(), &[][..]),
            ("proxy", "system:kube-proxy".to_owned(), &[][..]),
        ] {
            let (c, k) = leaf(&ca, &cn, orgs, &[], false);
            write(&format!("{file}.crt"), &c);
            write(&format!("{file}.key"), &k);
        }

        let (fp_pem, fp_key, fp_params) = make_ca("front-proxy-ca").unwrap();
        write("front-proxy-ca.crt", &fp_pem);
        write("front-proxy-ca.key", &fp_key.serialize_pem());
        let fp = Issuer::new(fp_params, &fp_key);
        let (c, k) = leaf(&fp, "front-proxy-client", &[], &[], false);
        write("front-proxy-client.crt", &c);
        write("front-proxy-client.key", &k);

        let (pc_pem, pc_key, pc_params) = make_ca("podset-apiserver-ca").unwrap();
        write("podset-ca.crt", &pc_pem);
        let pc = Issuer::new(pc_params, &pc_key);
        // Every Service deploy/base/apiservice.yaml names: kube-apiserver checks the name of the one it dials.
        let mut names: Vec<String> = crate::aggregation::services()
            .iter()
            .flat_map(|s| [format!("{s}.podset-system.svc"), format!("{s}.podset-system")])
            .collect();
        names.extend(REPLICA_IPS.map(String::from));
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let (c, k) = leaf(&pc, "podset-apiserver.podset-system.svc", &[], &names, true);
        write("podset.crt", &c);
        write("podset.key", &k);

        let sa = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        write("sa.key", &sa.serialize_pem());
        write("sa.pub", &sa.public_key_pem());
        Self { dir: dir.to_owned() }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    pub(crate) fn b64(&self, name: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(self.dir.join(name)).unwrap())
    }
}
