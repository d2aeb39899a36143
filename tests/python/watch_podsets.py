"""Watches PodSets with the official Python client and prints one line per event: TYPE NAME RESOURCE_VERSION.

Usage: watch_podsets.py URL CA_FILE NAMESPACE RESOURCE_VERSION COUNT
"""
import sys

from kubernetes import client, watch

url, ca, namespace, rv, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
cfg = client.Configuration()
cfg.host = url
cfg.ssl_ca_cert = ca
cfg.api_key = {"authorization": "Bearer dev"}
api = client.CustomObjectsApi(client.ApiClient(cfg))
seen = 0
for event in watch.Watch().stream(
    api.list_namespaced_custom_object,
    "demo.k8s.io", "v1alpha1", namespace, "podsets",
    resource_version=rv, timeout_seconds=20,
):
    obj = event["object"]
    print(event["type"], obj["metadata"]["name"], obj["metadata"]["resourceVersion"], flush=True)
    seen += 1
    if seen == count:
        break
