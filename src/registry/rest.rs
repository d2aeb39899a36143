//! A resource's registry with its type erased (k8s.io/apiserver's `rest.Storage` and the interfaces the
//! installer checks for): what the HTTP layer calls, through one map from path to storage, for any resource. Every
//! `Registry<S>` is one; the main resource, `/status` and `/scale` are its parts ([`Subresource`]), each written
//! through the strategy's own PrepareForUpdate.

use async_trait::async_trait;
use k8s_openapi::api::autoscaling::v1::Scale;
use serde_json::Value;

use super::error::Result;
use super::key::ObjectKey;
use super::migrate::Migration;
use super::options::{DeleteOptions, Deleted, ListPage, ListRequest, PatchType, ScaleChange, WriteOptions, Written};
use super::stored::Stored;
use super::strategy::Strategy;
use super::watch::{Watch, WatchRequest};
use super::{Registry, Revision};
use crate::api::resource::{ResourceInfo, ServedVersion, VersionIndex};
use crate::api::Subresource;

#[async_trait]
pub trait RestStorage: Send + Sync + 'static {
    fn resource(&self) -> &'static ResourceInfo;
    /// Whether it has `/scale` (its strategy says where replicas are).
    fn has_scale(&self) -> bool;
    /// The version objects are written in.
    fn storage_version(&self) -> VersionIndex;
    /// Objects stored, for `apiserver_storage_objects`.
    fn object_count(&self) -> usize;
    /// A create's or update's body as the audit log records it (kube's `LogRequestObject`).
    fn request_object(&self, body: Value, sub: Subresource) -> Option<Value>;
    /// One pass of the storage migration ([`Registry::migrate_storage`]).
    async fn migrate_storage(&self) -> Result<Migration>;

    async fn get(&self, key: &ObjectKey, resource_version: Option<Revision>) -> Result<Stored>;
    async fn list(&self, req: ListRequest) -> Result<ListPage>;
    async fn watch(&self, req: WatchRequest) -> Result<Watch>;
    async fn create(&self, namespace: &str, body: Value, opts: &WriteOptions) -> Result<Written>;
    async fn create_json(&self, namespace: &str, body: &[u8], opts: &WriteOptions) -> Result<Written>;
    async fn replace(&self, key: &ObjectKey, body: Value, sub: Subresource, opts: &WriteOptions) -> Result<Written>;
    async fn patch(
        &self,
        key: &ObjectKey,
        patch: &[u8],
        patch_type: PatchType,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Written>;
    async fn get_scale(&self, key: &ObjectKey, resource_version: Option<Revision>) -> Result<Scale>;
    async fn update_scale(&self, key: &ObjectKey, change: ScaleChange<'_>, opts: &WriteOptions) -> Result<Scale>;
    async fn delete(&self, key: &ObjectKey, delete: &DeleteOptions, opts: &WriteOptions) -> Result<Deleted>;
    async fn delete_collection(
        &self,
        req: ListRequest,
        delete: &DeleteOptions,
        opts: &WriteOptions,
    ) -> Result<(Vec<Stored>, Revision)>;
}

#[async_trait]
impl<S: Strategy> RestStorage for Registry<S> {
    fn resource(&self) -> &'static ResourceInfo {
        S::INFO
    }

    fn has_scale(&self) -> bool {
        S::scale().is_some()
    }

    fn storage_version(&self) -> VersionIndex {
        self.storage_version.to_index()
    }

    fn object_count(&self) -> usize {
        Registry::object_count(self)
    }

    fn request_object(&self, body: Value, sub: Subresource) -> Option<Value> {
        super::view::request_object::<S>(body, sub)
    }

    async fn migrate_storage(&self) -> Result<Migration> {
        Registry::migrate_storage(self).await
    }

    async fn get(&self, key: &ObjectKey, resource_version: Option<Revision>) -> Result<Stored> {
        Registry::get(self, key, resource_version).await
    }

    async fn list(&self, req: ListRequest) -> Result<ListPage> {
        Registry::list(self, req).await
    }

    async fn watch(&self, req: WatchRequest) -> Result<Watch> {
        Registry::watch(self, req).await
    }

    async fn create(&self, namespace: &str, body: Value, opts: &WriteOptions) -> Result<Written> {
        Registry::create(self, namespace, body, opts).await
    }

    async fn create_json(&self, namespace: &str, body: &[u8], opts: &WriteOptions) -> Result<Written> {
        Registry::create_json(self, namespace, body, opts).await
    }

    async fn replace(&self, key: &ObjectKey, body: Value, sub: Subresource, opts: &WriteOptions) -> Result<Written> {
        Registry::replace(self, key, body, sub, opts).await
    }

    async fn patch(
        &self,
        key: &ObjectKey,
        patch: &[u8],
        patch_type: PatchType,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Written> {
        Registry::patch(self, key, patch, patch_type, sub, opts).await
    }

    async fn get_scale(&self, key: &ObjectKey, resource_version: Option<Revision>) -> Result<Scale> {
        Registry::get_scale(self, key, resource_version).await
    }

    async fn update_scale(&self, key: &ObjectKey, change: ScaleChange<'_>, opts: &WriteOptions) -> Result<Scale> {
        Registry::update_scale(self, key, change, opts).await
    }

    async fn delete(&self, key: &ObjectKey, delete: &DeleteOptions, opts: &WriteOptions) -> Result<Deleted> {
        Registry::delete(self, key, delete, opts).await
    }

    async fn delete_collection(
        &self,
        req: ListRequest,
        delete: &DeleteOptions,
        opts: &WriteOptions,
    ) -> Result<(Vec<Stored>, Revision)> {
        Registry::delete_collection(self, req, delete, opts).await
    }
}
