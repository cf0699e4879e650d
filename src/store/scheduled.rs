//! The store's part in scheduled delivery (RocketMQ 4.x does it inside `CommitLog`,
//! 5.x in a broker put hook): a put of a delayed or timed message stores it in its
//! schedule topic (`format::schedule` has the layout), dispatch gives such records
//! their delivery time as tagsCode and notes every delivered record's position
//! (`delivered.rs`), and the delivery services (`crate::schedule`, `crate::timer`)
//! reach the store through the calls here. The services themselves run above the
//! store (they route deliveries to other shards); a store only keeps them in a list so
//! that its shutdown stops them first.

use super::delivered::Delivered;
use super::{Inner, Store};
use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::format::consume_queue::CqEntry;
use crate::format::delay_offset::{DelayOffsets, Key, Lane};
use crate::format::java::tags_code;
use crate::format::properties::DELAY;
use crate::format::record::{RecordView, SYSFLAG_TRANSACTION_MASK};
use crate::format::schedule::{
    self, Admission, DelayLevels, Position, REAL_QID, REAL_TOPIC, Refusal, SCHEDULE_TOPIC,
    TIMER_OUT_MS, TIMER_TOPIC, TimerRules,
};
use crate::message::*;
use std::cell::RefCell;
use std::path::PathBuf;

/// A background service attached to a store: told to stop, then awaited, when the
/// store shuts down.
struct Service {
    name: &'static str,
    stop: Box<dyn FnOnce()>,
    task: glommio::task::JoinHandle<()>,
}

/// Scheduling state of a store.
pub(super) struct Scheduling {
    levels: DelayLevels,
    timer: TimerRules,
    /// This store's shard (its log base >> 56): the shard of its own lanes.
    own_shard: u32,
    delivered: RefCell<Delivered>,
    services: RefCell<Vec<Service>>,
    /// Per level (queue id): notified when dispatch appends an entry to that
    /// `SCHEDULE_TOPIC_XXXX` queue, so an idle level task sleeps until then instead of
    /// polling (`crate::schedule`).
    arrivals: Vec<crate::wake::Notify>,
    /// Notified when dispatch appends an entry to the timer queue (`crate::timer`).
    timer_arrivals: crate::wake::Notify,
}

/// `<root>/config/delayOffset.json`.
pub(crate) fn delay_offset_path(root: &std::path::Path) -> PathBuf {
    root.join("config").join("delayOffset.json")
}

impl Scheduling {
    /// Reads `config/delayOffset.json` (RocketMQ's, or coremq's with positions). A
    /// file that does not parse refuses the open, naming it: RocketMQ's broker refuses
    /// to start on it too.
    pub(super) fn load(cfg: &StoreConfig) -> Result<Scheduling> {
        let own_shard = cfg.shard_index();
        let path = delay_offset_path(&cfg.root);
        let delivered = match cfg.disk.read_file(&path)? {
            None => Delivered::default(),
            Some(bytes) => {
                let file = DelayOffsets::decode(&bytes).map_err(|why| Error::BadLayout {
                    path: path.clone(),
                    why: format!("delay offsets do not parse: {why}"),
                })?;
                Delivered::from_file(&file, own_shard)
            }
        };
        let levels = cfg.schedule.levels()?;
        Ok(Scheduling {
            arrivals: (0..levels.count()).map(|_| Default::default()).collect(),
            timer_arrivals: Default::default(),
            levels,
            timer: TimerRules {
                enabled: cfg.schedule.timer_enable,
                max_delay_ms: cfg.schedule.timer_max_delay.as_millis() as i64,
            },
            own_shard,
            delivered: RefCell::new(delivered),
            services: RefCell::new(Vec::new()),
        })
    }
}

impl Inner {
    /// What a put does with `m` (`format::schedule::admit`).
    pub(super) fn admit(&self, m: &Message) -> Admission {
        // The clock only for a message that could be scheduled (a clock read is ~1% of
        // a node's samples under single sends on this VM).
        if !schedule::may_schedule(&m.properties) {
            return Admission::Plain;
        }
        schedule::admit(
            &m.topic,
            m.sys_flag & SYSFLAG_TRANSACTION_MASK,
            &m.properties,
            crate::now_ms(),
            &self.sched.levels,
            self.sched.timer,
        )
    }

    /// `m` as stored in its schedule topic (`admission` is `Delay` or `Timer`).
    pub(super) fn scheduled_copy(&self, m: &Message, admission: Admission) -> Message {
        let mut s = m.clone();
        schedule::set_property(&mut s.properties, REAL_TOPIC, m.topic.clone());
        schedule::set_property(&mut s.properties, REAL_QID, m.queue_id.to_string());
        match admission {
            Admission::Delay { level } => {
                schedule::set_property(&mut s.properties, DELAY, level.to_string());
                s.topic = SCHEDULE_TOPIC.to_string();
                s.queue_id = level - 1;
            }
            Admission::Timer { deliver_ms } => {
                schedule::set_property(&mut s.properties, TIMER_OUT_MS, deliver_ms.to_string());
                s.topic = TIMER_TOPIC.to_string();
                s.queue_id = 0;
            }
            Admission::Plain | Admission::Refused(_) => {}
        }
        s
    }

    /// The ConsumeQueue tagsCode of a record: the delivery time in the schedule
    /// topics, the tags hash elsewhere.
    pub(super) fn tags_code_of(&self, r: &RecordView<'_>) -> i64 {
        let scheduled = if r.topic == SCHEDULE_TOPIC {
            schedule::schedule_tags_code(r.store_timestamp, r.property(DELAY), &self.sched.levels)
        } else if r.topic == TIMER_TOPIC {
            schedule::timer_tags_code(r.property(TIMER_OUT_MS), r.store_timestamp)
        } else {
            None
        };
        scheduled.unwrap_or_else(|| tags_code(r.tags()))
    }

    /// Notes a dispatched record's delivery position, if it carries one.
    pub(super) fn note_delivered(&self, r: &RecordView<'_>) {
        if let Some(p) = Position::of_record(r.properties) {
            let end = r.phys_offset as u64 + r.total_size as u64;
            self.sched.delivered.borrow_mut().note(end, p);
        }
    }

    /// Writes `config/delayOffset.json` covering every record below `upto` (durable
    /// and dispatched), if the table changed; before the checkpoint that resumes at
    /// `upto` (`delivered.rs`).
    pub(super) async fn write_delivered(&self, upto: u64) -> Result<()> {
        let (file, base) = {
            let mut d = self.sched.delivered.borrow_mut();
            d.merge_upto(upto);
            match d.file_if_changed(self.sched.own_shard) {
                None => return Ok(()),
                Some(f) => (f, d.base().clone()),
            }
        };
        let path = delay_offset_path(&self.cfg.root);
        let bytes = file.encode(crate::now_ms());
        self.cfg
            .disk
            .off_executor(move |disk| {
                if let Some(dir) = path.parent() {
                    disk.create_dir_all(dir)?;
                }
                disk.replace_file(&path, &bytes)
            })
            .await?;
        self.sched.delivered.borrow_mut().written(base);
        Ok(())
    }

    /// Tells the attached services to stop (without waiting).
    pub(super) fn signal_services(&self) {
        for s in self.sched.services.borrow_mut().iter_mut() {
            let stop = std::mem::replace(&mut s.stop, Box::new(|| {}));
            stop();
        }
    }
}

/// Why a scheduled put was refused, as a status.
pub(super) fn refusal_status(r: Refusal) -> PutStatus {
    PutStatus::MessageIllegal(match r {
        Refusal::DelayNotANumber | Refusal::TimerNotANumber => IllegalReason::ScheduleInvalid,
        Refusal::TimerTooFar => IllegalReason::TimerTooFar,
        Refusal::TimerDisabled => IllegalReason::TimerDisabled,
    })
}

impl Inner {
    /// Dispatch appended an entry to the timer queue.
    pub(super) fn timer_arrived(&self) {
        self.sched.timer_arrivals.notify();
    }

    /// Dispatch appended an entry to `SCHEDULE_TOPIC_XXXX` queue `queue_id`.
    pub(super) fn schedule_arrived(&self, queue_id: i32) {
        if let Some(n) = usize::try_from(queue_id)
            .ok()
            .and_then(|q| self.sched.arrivals.get(q))
        {
            n.notify();
        }
    }
}

impl Store {
    /// Completes when dispatch appended an entry to level `level`'s queue since the
    /// last completion (at once for a level out of range). One waiter per level: the
    /// level's delivery task (`crate::schedule`).
    pub async fn schedule_arrival(&self, level: i32) {
        let q = usize::try_from(level - 1).ok();
        if let Some(n) = q.and_then(|q| self.inner.sched.arrivals.get(q)) {
            n.wait().await;
        }
    }

    /// Completes when dispatch appended an entry to the timer queue since the last
    /// completion. One waiter: the timer (`crate::timer`).
    pub async fn timer_arrival(&self) {
        self.inner.sched.timer_arrivals.wait().await;
    }

    /// A time `N` (epoch ms) such that every timer-queue entry due before `N` is in the
    /// queue when this returns: `N` is now, and this waits until dispatch has caught up
    /// with what was written at that moment. Store timestamps never go backwards in
    /// log order, so a record written later has a store timestamp, hence a due time, of
    /// at least `N` (`crate::timer`).
    pub async fn timer_horizon(&self) -> i64 {
        let n = crate::now_ms();
        if self.inner.dispatched.get() < self.inner.log.written() {
            self.wait_dispatched().await;
        }
        n
    }

    /// The store's delay levels (`ScheduleConfig::message_delay_level`).
    pub fn delay_levels(&self) -> &DelayLevels {
        &self.inner.sched.levels
    }

    /// This store's shard (0 for a single store).
    pub fn shard_index(&self) -> u32 {
        self.inner.sched.own_shard
    }

    /// Up to `count` ConsumeQueue entries of a queue from `offset` (fewer at its end):
    /// (commit-log offset, size, tagsCode). The schedule topics' tagsCodes are
    /// delivery times.
    pub async fn queue_entries(
        &self,
        topic: &str,
        queue_id: i32,
        offset: QueueOffset,
        count: usize,
    ) -> Result<Vec<CqEntry>> {
        let Some(q) = self.inner.queues.find(topic, queue_id) else {
            return Ok(Vec::new());
        };
        let max = q.cq.max_offset();
        if offset >= max {
            return Ok(Vec::new());
        }
        let n = count.min((max - offset) as usize);
        q.cq.entries(offset, n).await
    }

    /// The newest delivery of `lane` (source shard, lane) in this store's log
    /// (`delivered.rs`).
    pub fn newest_delivery(&self, lane: Lane) -> Option<Key> {
        self.inner.sched.delivered.borrow().newest(lane)
    }

    /// Stores a delivered message with its position as its first property, without
    /// scheduling it again and without waiting for a sync flush (RocketMQ's
    /// deliveries are `WAIT = false`).
    pub(crate) async fn put_delivery(&self, msg: &Message, pos: Position) -> PutResult {
        self.put_records(std::slice::from_ref(msg), Some(pos)).await
    }

    /// Attaches a background service: `stop` tells it to stop, `task` ends when it
    /// has. A shutdown (and [`Store::stop_services`]) stops every service before
    /// anything else.
    pub fn attach_service(
        &self,
        name: &'static str,
        stop: impl FnOnce() + 'static,
        task: glommio::task::JoinHandle<()>,
    ) {
        self.inner.sched.services.borrow_mut().push(Service {
            name,
            stop: Box::new(stop),
            task,
        });
    }

    /// Stops the attached services and waits for them. A sharded store calls this on
    /// every shard before shutting any down: a service may be waiting on a put to
    /// another shard.
    pub async fn stop_services(&self) {
        self.inner.signal_services();
        let services: Vec<Service> = self.inner.sched.services.borrow_mut().drain(..).collect();
        for s in services {
            s.task.await;
            tracing::debug!(service = s.name, "service stopped");
        }
    }
}
