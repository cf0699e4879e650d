//! RocketMQ's request and response codes (`RequestCode`, `ResponseCode`).

/// The protocol version this side states (RocketMQ's `MQVersion` of 4.9.x).
pub const OUR_VERSION: i32 = 401;

// Requests.
pub const SEND_MESSAGE: i32 = 10;
pub const PULL_MESSAGE: i32 = 11;
pub const QUERY_MESSAGE: i32 = 12;
pub const QUERY_CONSUMER_OFFSET: i32 = 14;
pub const UPDATE_CONSUMER_OFFSET: i32 = 15;
pub const UPDATE_AND_CREATE_TOPIC: i32 = 17;
pub const GET_ALL_TOPIC_CONFIG: i32 = 21;
pub const SEARCH_OFFSET_BY_TIMESTAMP: i32 = 29;
pub const GET_MAX_OFFSET: i32 = 30;
pub const GET_MIN_OFFSET: i32 = 31;
pub const GET_EARLIEST_MSG_STORETIME: i32 = 32;
pub const VIEW_MESSAGE_BY_ID: i32 = 33;
pub const HEART_BEAT: i32 = 34;
pub const UNREGISTER_CLIENT: i32 = 35;
pub const CONSUMER_SEND_MSG_BACK: i32 = 36;
pub const END_TRANSACTION: i32 = 37;
pub const GET_CONSUMER_LIST_BY_GROUP: i32 = 38;
/// Broker to producer: what became of this half message?
pub const CHECK_TRANSACTION_STATE: i32 = 39;
/// Broker to consumer (one-way): the group's member set changed; rebalance now.
pub const NOTIFY_CONSUMER_IDS_CHANGED: i32 = 40;
pub const GET_ALL_CONSUMER_OFFSET: i32 = 43;
pub const UPDATE_BROKER_CONFIG: i32 = 25;
pub const GET_BROKER_CONFIG: i32 = 26;
pub const GET_BROKER_RUNTIME_INFO: i32 = 28;
pub const LOCK_BATCH_MQ: i32 = 41;
pub const UNLOCK_BATCH_MQ: i32 = 42;
pub const CHECK_CLIENT_CONFIG: i32 = 46;
pub const UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: i32 = 200;
pub const GET_ALL_SUBSCRIPTIONGROUP_CONFIG: i32 = 201;
pub const GET_TOPIC_STATS_INFO: i32 = 202;
pub const GET_CONSUMER_CONNECTION_LIST: i32 = 203;
pub const GET_PRODUCER_CONNECTION_LIST: i32 = 204;
pub const GET_ALL_TOPIC_LIST_FROM_NAMESERVER: i32 = 206;
pub const DELETE_SUBSCRIPTIONGROUP: i32 = 207;
pub const GET_CONSUME_STATS: i32 = 208;
pub const DELETE_TOPIC_IN_BROKER: i32 = 215;
/// Broker to consumer (one-way): take these offsets (after an admin reset).
pub const RESET_CONSUMER_CLIENT_OFFSET: i32 = 220;
/// Admin to broker: reset a group's offsets of a topic by store time.
pub const INVOKE_BROKER_TO_RESET_OFFSET: i32 = 222;
pub const DELETE_TOPIC_IN_NAMESRV: i32 = 216;
pub const CLEAN_UNUSED_TOPIC: i32 = 316;
pub const DELETE_EXPIRED_COMMITLOG: i32 = 329;
pub const REGISTER_BROKER: i32 = 103;
pub const GET_ROUTEINFO_BY_TOPIC: i32 = 105;
pub const GET_BROKER_CLUSTER_INFO: i32 = 106;
/// RocketMQ-Rust's batch forms of 215 and 207 (`rocketmq-admin-cli` deleteTopic and
/// deleteSubGroup send them).
pub const DELETE_TOPIC_IN_BROKER_LIST: i32 = 5002;
pub const DELETE_SUBSCRIPTIONGROUP_LIST: i32 = 5003;
pub const SEND_MESSAGE_V2: i32 = 310;
pub const SEND_BATCH_MESSAGE: i32 = 320;
pub const LITE_PULL_MESSAGE: i32 = 361;

// Fault injection, answered only by a node started with `test_hooks` (never set by
// default, nor by anything in `coremq serve` unless its config file says so); any
// other node answers them `REQUEST_CODE_NOT_SUPPORTED`. Negative: no RocketMQ code.
/// The request's handler panics (the node answers `SYSTEM_ERROR`, the shard goes on).
pub const TEST_PANIC_IN_HANDLER: i32 = -16001;
/// A store call made for the request panics (the shard stops, the node fails loudly).
pub const TEST_PANIC_IN_STORE: i32 = -16002;

// Responses.
pub const SUCCESS: i32 = 0;
pub const SYSTEM_ERROR: i32 = 1;
pub const SYSTEM_BUSY: i32 = 2;
pub const REQUEST_CODE_NOT_SUPPORTED: i32 = 3;
pub const FLUSH_DISK_TIMEOUT: i32 = 10;
pub const SLAVE_NOT_AVAILABLE: i32 = 11;
pub const FLUSH_SLAVE_TIMEOUT: i32 = 12;
pub const MESSAGE_ILLEGAL: i32 = 13;
pub const SERVICE_NOT_AVAILABLE: i32 = 14;
pub const NO_PERMISSION: i32 = 16;
pub const TOPIC_NOT_EXIST: i32 = 17;
pub const PULL_NOT_FOUND: i32 = 19;
pub const PULL_RETRY_IMMEDIATELY: i32 = 20;
pub const PULL_OFFSET_MOVED: i32 = 21;
pub const QUERY_NOT_FOUND: i32 = 22;
pub const SUBSCRIPTION_PARSE_FAILED: i32 = 23;
pub const SUBSCRIPTION_GROUP_NOT_EXIST: i32 = 26;
pub const INVALID_PARAMETER: i32 = 29;
pub const CONSUMER_NOT_ONLINE: i32 = 206;
