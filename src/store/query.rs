//! Query by key across this shard's IndexFiles: RocketMQ's
//! `DefaultMessageStore.queryMessage` (IndexService lookups, each hit read back from the
//! CommitLog and checked).

use super::Store;
use crate::error::{Error, Result};
use crate::format::{index_file, properties};
use crate::index::check_query;
use crate::message::StoredMessage;

impl Store {
    /// Messages of `topic` carrying `key` (a `KEYS` part or the `UNIQ_KEY`) stored
    /// within `[begin_ms, end_ms]` (inclusive, store time), newest first, at most
    /// `max` (clamped to `query_max`, 64 by default). Each hit is read from the
    /// CommitLog and verified: checksums, topic, the real key (hashes collide) and
    /// the exact store time, so only true matches come back.
    ///
    /// Bad input: an empty topic or key, a key longer than 32767 bytes (no record can
    /// carry one), or `begin_ms > end_ms` is `Error::BadRequest`; `max == 0` is an
    /// empty answer. With the index disabled (`index_enable = false`) every query is
    /// `Error::BadRequest`.
    pub async fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        max: usize,
        begin_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<StoredMessage>> {
        check_query(topic, key, begin_ms, end_ms)?;
        let Some(ix) = self.index_service() else {
            return Err(Error::BadRequest(
                "the key index is disabled on this store".into(),
            ));
        };
        let max = max.min(self.config().query_max);
        ix.query(topic, key, begin_ms, end_ms, max, |offset| async move {
            let Some(m) = self.look_by_offset(offset).await? else {
                return Ok(None);
            };
            let ok = m.topic == topic
                && !self.inner.clean.deleted.is_deleted(topic, m.log_offset)
                && (begin_ms..=end_ms).contains(&m.store_timestamp_ms)
                && index_file::has_key(
                    m.property(properties::UNIQ_KEY),
                    m.property(properties::KEYS),
                    key,
                );
            Ok(ok.then_some(m))
        })
        .await
    }
}
