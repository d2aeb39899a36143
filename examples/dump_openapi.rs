fn main() {
    let v = podset_apiserver::api::schema::openapi_v3();
    println!("{}", serde_json::to_string_pretty(&v["components"]["schemas"]["io.k8s.demo.v1alpha1.PodSet"]).unwrap());
    let v = podset_apiserver::api::schema::openapi_v2();
    println!("{}", serde_json::to_string_pretty(&v["definitions"]["io.k8s.demo.v1alpha1.PodSet"]).unwrap());
    println!("{:?}", v["definitions"].as_object().unwrap().keys().collect::<Vec<_>>().len());
}
