//! Consumer-group state the admin tool and orderly consumers need:
//! [`SubscriptionGroups`] (RocketMQ's `SubscriptionGroupManager`,
//! `config/subscriptionGroup.json`), [`QueueLocks`] (`RebalanceLockManager`) and
//! [`Connections`] (what `ConsumerManager` / `ProducerManager` keep of each client's
//! connection for the connection lists, codes 203 and 204).
//!
//! A group's config is kept as the JSON object the tool sent, with RocketMQ's defaults
//! filled in for the fields it left out, so every field (also ones this node does not
//! act on) reads back as written. Groups are also known without a config, as RocketMQ
//! creates them on first use (`autoCreateSubscriptionGroup`); the table lists the
//! configured ones.
//!
//! Queue locks follow RocketMQ's rules (reference §25.3): a queue is granted to a
//! client that holds it unexpired (refreshed), has no holder, or whose holder's lock
//! expired (60 s without a refresh); otherwise it is left out of the answer. Unlock
//! removes only the caller's own locks. Locks live in memory (RocketMQ's do too: a
//! restart frees every queue, and clients re-lock every 20 s).

use super::state::{lock, read_json, write_json};
use crate::error::{Error, Result};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// RocketMQ's `REBALANCE_LOCK_MAX_LIVE_TIME`.
pub const LOCK_MAX_LIVE: Duration = Duration::from_secs(60);

/// Subscription-group configs by name, persisted.
pub struct SubscriptionGroups {
    path: PathBuf,
    table: Mutex<BTreeMap<String, Value>>,
}

/// RocketMQ's `SubscriptionGroupConfig` defaults, for fields a request leaves out.
fn defaults(name: &str) -> Value {
    json!({
        "groupName": name,
        "consumeEnable": true,
        "consumeFromMinEnable": true,
        "consumeBroadcastEnable": true,
        "consumeMessageOrderly": false,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": true,
        "groupSysFlag": 0,
        "consumeTimeoutMinute": 15,
    })
}

impl SubscriptionGroups {
    pub fn load(config_dir: &Path) -> Result<SubscriptionGroups> {
        let path = config_dir.join("subscriptionGroup.json");
        let mut table = BTreeMap::new();
        if let Some(v) = read_json(&path)?
            && let Some(t) = v.get("subscriptionGroupTable").and_then(Value::as_object)
        {
            for (name, c) in t {
                if !c.is_object() {
                    return Err(Error::Config(format!(
                        "{}: group {name:?} is not an object",
                        path.display()
                    )));
                }
                table.insert(name.clone(), c.clone());
            }
        }
        Ok(SubscriptionGroups {
            path,
            table: Mutex::new(table),
        })
    }

    /// Creates or updates a group from a `SubscriptionGroupConfig` object (its
    /// `groupName` names it); returns the stored config.
    pub fn put(&self, config: &Value) -> std::result::Result<Value, String> {
        let obj = config
            .as_object()
            .ok_or("the subscription group config is not a JSON object")?;
        let name = obj
            .get("groupName")
            .and_then(Value::as_str)
            .ok_or("the subscription group config has no groupName")?;
        if !super::processor::valid_name(name) {
            return Err(format!(
                "invalid group name {name:?} (want [%|a-zA-Z0-9_-]{{1,255}})"
            ));
        }
        let mut merged = defaults(name);
        let m = merged.as_object_mut().expect("an object");
        for (k, v) in obj {
            m.insert(k.clone(), v.clone());
        }
        let snapshot = {
            let mut t = lock(&self.table);
            t.insert(name.to_string(), merged.clone());
            self.to_json(&t)
        };
        write_json(&self.path, &snapshot).map_err(|e| e.to_string())?;
        Ok(merged)
    }

    /// Removes a group; whether it was configured.
    pub fn remove(&self, name: &str) -> Result<bool> {
        let snapshot = {
            let mut t = lock(&self.table);
            if t.remove(name).is_none() {
                return Ok(false);
            }
            self.to_json(&t)
        };
        write_json(&self.path, &snapshot)?;
        Ok(true)
    }

    /// Whether the group's members are told when its member set changes (the
    /// config's `notifyConsumerIdsChangedEnable`; true for a group without a config).
    pub fn notify_ids_changed(&self, name: &str) -> bool {
        lock(&self.table)
            .get(name)
            .and_then(|c| c.get("notifyConsumerIdsChangedEnable"))
            .and_then(Value::as_bool)
            .unwrap_or(true)
    }

    /// Whether the group has a config.
    pub fn contains(&self, name: &str) -> bool {
        lock(&self.table).contains_key(name)
    }

    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<Value> {
        lock(&self.table).get(name).cloned()
    }

    /// RocketMQ's `SubscriptionGroupWrapper`: the table and a data version.
    pub fn wrapper(&self) -> Value {
        self.to_json(&lock(&self.table))
    }

    fn to_json(&self, t: &BTreeMap<String, Value>) -> Value {
        json!({
            "subscriptionGroupTable": t,
            "forbiddenTable": {},
            "dataVersion": {"counter": t.len(), "timestamp": crate::now_ms()},
        })
    }
}

/// One locked queue: (topic, broker name, queue id).
pub type LockedQueue = (String, String, i32);

/// A group's locked queues: holder and last refresh.
type GroupLocks = HashMap<LockedQueue, (String, Instant)>;

/// Queue locks per consumer group (module docs).
#[derive(Default)]
pub struct QueueLocks {
    groups: Mutex<HashMap<String, GroupLocks>>,
}

impl QueueLocks {
    /// Locks what it can of `queues` for `client`; returns the queues granted.
    pub fn try_lock(&self, group: &str, client: &str, queues: &[LockedQueue]) -> Vec<LockedQueue> {
        let now = Instant::now();
        let mut g = lock(&self.groups);
        let table = g.entry(group.to_string()).or_default();
        let mut granted = Vec::new();
        for q in queues {
            let free = match table.get(q) {
                None => true,
                Some((holder, at)) => holder == client || now.duration_since(*at) > LOCK_MAX_LIVE,
            };
            if free {
                let prev = table.insert(q.clone(), (client.to_string(), now));
                if prev.as_ref().is_none_or(|(holder, _)| holder != client) {
                    tracing::debug!(group, client, topic = %q.0, queue = q.2, expired_holder = ?prev.map(|p| p.0), "queue lock granted");
                }
                granted.push(q.clone());
            }
        }
        granted
    }

    /// Releases `client`'s locks among `queues`.
    pub fn unlock(&self, group: &str, client: &str, queues: &[LockedQueue]) {
        let mut g = lock(&self.groups);
        if let Some(table) = g.get_mut(group) {
            for q in queues {
                if table.get(q).is_some_and(|(holder, _)| holder == client) {
                    table.remove(q);
                    tracing::debug!(group, client, topic = %q.0, queue = q.2, "queue lock released");
                }
            }
            if table.is_empty() {
                g.remove(group);
            }
        }
    }

    /// The holder of a queue's unexpired lock.
    #[cfg(test)]
    pub fn holder(&self, group: &str, q: &LockedQueue) -> Option<String> {
        let g = lock(&self.groups);
        g.get(group)
            .and_then(|t| t.get(q))
            .filter(|(_, at)| at.elapsed() <= LOCK_MAX_LIVE)
            .map(|(c, _)| c.clone())
    }
}

/// What the last heartbeat on a connection said.
#[derive(Debug, Clone)]
pub struct ClientConn {
    pub client_id: String,
    pub addr: String,
    pub language: String,
    pub version: i32,
    /// Consumer group -> its `ConsumerData` object from the heartbeat.
    pub consumers: BTreeMap<String, Value>,
    pub producers: Vec<String>,
}

/// The clients' connections by connection id (heartbeats set them; a closed
/// connection's entry goes). Group membership itself is `state::Clients`' (it also
/// expires silent clients): the lists are filtered by it.
#[derive(Default)]
pub struct Connections {
    conns: Mutex<HashMap<u64, ClientConn>>,
}

impl Connections {
    /// Records a heartbeat; what the connection's previous one said.
    pub fn heartbeat(&self, conn: u64, info: ClientConn) -> Option<ClientConn> {
        lock(&self.conns).insert(conn, info)
    }

    /// The language the connection's client named in its last heartbeat.
    pub fn language(&self, conn: u64) -> Option<String> {
        lock(&self.conns).get(&conn).map(|c| c.language.clone())
    }

    pub fn closed(&self, conn: u64) {
        lock(&self.conns).remove(&conn);
    }

    /// The connections whose last heartbeat named consumer `group`.
    pub fn consumers_of(&self, group: &str) -> Vec<ClientConn> {
        let mut v: Vec<ClientConn> = lock(&self.conns)
            .values()
            .filter(|c| c.consumers.contains_key(group))
            .cloned()
            .collect();
        v.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        v
    }

    /// The connections whose last heartbeat named producer `group`.
    pub fn producers_of(&self, group: &str) -> Vec<ClientConn> {
        let mut v: Vec<ClientConn> = lock(&self.conns)
            .values()
            .filter(|c| c.producers.iter().any(|g| g == group))
            .cloned()
            .collect();
        v.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_grant_refresh_refuse_and_unlock_by_owner_only() {
        let l = QueueLocks::default();
        let q = |i| ("T".to_string(), "b".to_string(), i);
        assert_eq!(l.try_lock("g", "c1", &[q(0), q(1)]), vec![q(0), q(1)]);
        assert_eq!(l.try_lock("g", "c2", &[q(1), q(2)]), vec![q(2)]);
        assert_eq!(
            l.try_lock("g", "c1", &[q(1)]),
            vec![q(1)],
            "its own: refreshed"
        );
        assert_eq!(
            l.try_lock("other", "c2", &[q(1)]),
            vec![q(1)],
            "groups apart"
        );
        l.unlock("g", "c2", &[q(0), q(1)]);
        assert_eq!(
            l.holder("g", &q(1)).as_deref(),
            Some("c1"),
            "not c2's to unlock"
        );
        l.unlock("g", "c1", &[q(1)]);
        assert_eq!(l.holder("g", &q(1)), None);
        assert_eq!(l.try_lock("g", "c2", &[q(1)]), vec![q(1)]);
    }

    #[test]
    fn groups_fill_defaults_persist_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let g = SubscriptionGroups::load(dir.path()).unwrap();
        let stored = g
            .put(&json!({"groupName": "G1", "retryMaxTimes": 3}))
            .unwrap();
        assert_eq!(stored["retryMaxTimes"], 3);
        assert_eq!(stored["retryQueueNums"], 1);
        assert!(g.put(&json!({"groupName": "bad name"})).is_err());
        assert!(g.put(&json!([1])).is_err());
        let again = SubscriptionGroups::load(dir.path()).unwrap();
        assert_eq!(again.get("G1").unwrap()["retryMaxTimes"], 3);
        assert!(again.remove("G1").unwrap());
        assert!(!again.remove("G1").unwrap());
        let third = SubscriptionGroups::load(dir.path()).unwrap();
        assert!(third.get("G1").is_none());
    }
}
