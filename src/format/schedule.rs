//! How RocketMQ lays scheduled messages out in an ordinary store, and coremq's one
//! addition (the delivery position). Pure: strings and numbers in, decisions out.
//!
//! **Delay levels** (RocketMQ's `ScheduleMessageService`, `CommitLog.putMessage` in
//! 4.x, a broker put hook in 5.x). A message whose `DELAY` property is a level
//! `L > 0` (clamped to the number of levels) is stored in topic
//! [`SCHEDULE_TOPIC`], queue `L - 1`, with properties `REAL_TOPIC` and `REAL_QID`
//! naming where it goes; `DELAY` stays. Its ConsumeQueue tagsCode is the delivery
//! time, store timestamp + delay of `L` ([`schedule_tags_code`]).
//!
//! **Timed messages** (RocketMQ 5's `HookUtils.handleScheduleMessage`): the first of
//! `TIMER_DELAY_SEC`, `TIMER_DELAY_MS`, `TIMER_DELIVER_MS` present (then the Aliyun
//! `__STARTDELIVERTIME`, an absolute time that Apache brokers ignore and coremq honours)
//! gives the delivery time. A time at or before now makes an ordinary message; more than
//! the maximum ahead (3 days by default) is refused. Otherwise the message is stored in
//! [`TIMER_TOPIC`] queue 0 with `TIMER_OUT_MS` (the delivery time, in milliseconds:
//! RocketMQ rounds to its 1 s wheel, coremq keeps the exact time), `REAL_TOPIC` and
//! `REAL_QID`. A message with both a delay level and timer properties is a delay-level
//! message, as in RocketMQ. The timer topic's tagsCode is the due time,
//! `max(TIMER_OUT_MS, store timestamp)` (coremq's choice: the timer reads due times from
//! the queue alone).
//!
//! **Delivery position** (coremq's). A delivered message is a new record in its real
//! queue whose first property is [`POSITION`] = `shard,lane,hi,lo`: which shard's
//! schedule it came from, which lane (a delay level `1..`, or [`TIMER_LANE`]) and its
//! place in that lane's delivery order (a delay level: `hi` = its schedule-queue
//! offset; the timer: `hi` = delivery time, `lo` = timer-queue offset). Recovery
//! rebuilds each lane's progress from these records, so a delivery is never repeated
//! after a crash (`store/delivered.rs`). Only the store writes it: a `POSITION`
//! property on a put is dropped ([`crate::format::properties::encode_into`]), and it
//! is always first, so the dispatcher finds it with one prefix comparison.
//!
//! Delivered records keep every property of the scheduled one (`DELAY`,
//! `REAL_TOPIC`, `REAL_QID`, `TIMER_OUT_MS`), as RocketMQ's do on disk: RocketMQ
//! serialises the property string before removing those keys from the map.

use super::properties::{DELAY, NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR};

/// The delay-level messages' topic.
pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";
/// RocketMQ 5's timer topic.
pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";
/// Where a scheduled message goes, and where it came from.
pub const REAL_TOPIC: &str = "REAL_TOPIC";
pub const REAL_QID: &str = "REAL_QID";
pub const TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
pub const TIMER_DELAY_SEC: &str = "TIMER_DELAY_SEC";
pub const TIMER_DELAY_MS: &str = "TIMER_DELAY_MS";
pub const TIMER_OUT_MS: &str = "TIMER_OUT_MS";
/// Aliyun ONS / OpenMessaging absolute delivery time (epoch ms).
pub const START_DELIVER_TIME: &str = "__STARTDELIVERTIME";
/// coremq's delivery position (module docs).
pub const POSITION: &str = "COREMQ_SCHEDULE_POS";
/// The timer's lane in delivery positions (delay levels are `1..`).
pub const TIMER_LANE: u32 = 0;

/// RocketMQ's default `messageDelayLevel`.
pub const DEFAULT_DELAY_LEVELS: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";

/// Most delay levels accepted (RocketMQ's table is a map from int; 18 by default).
pub const MAX_LEVELS: usize = 256;

/// A parsed `messageDelayLevel`: the delay of level `i + 1` in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayLevels(Vec<u64>);

impl DelayLevels {
    /// Parses RocketMQ's space-separated list (`1s 5s ... 2h`; units `s`, `m`, `h`,
    /// `d`, and coremq's `ms`). Every level must be positive.
    pub fn parse(text: &str) -> Result<DelayLevels, String> {
        let mut out = Vec::new();
        for word in text.split_whitespace() {
            let (digits, unit_ms) = if let Some(d) = word.strip_suffix("ms") {
                (d, 1)
            } else if let Some(d) = word.strip_suffix('s') {
                (d, 1000)
            } else if let Some(d) = word.strip_suffix('m') {
                (d, 60_000)
            } else if let Some(d) = word.strip_suffix('h') {
                (d, 3_600_000)
            } else if let Some(d) = word.strip_suffix('d') {
                (d, 86_400_000)
            } else {
                return Err(format!(
                    "delay level {word:?} has no unit (ms, s, m, h or d)"
                ));
            };
            let n: u64 = digits
                .parse()
                .map_err(|_| format!("delay level {word:?} is not a whole number of {word}"))?;
            let ms = n
                .checked_mul(unit_ms)
                .filter(|ms| *ms > 0 && *ms <= i64::MAX as u64 / 4)
                .ok_or_else(|| format!("delay level {word:?} is zero or too long"))?;
            out.push(ms);
        }
        if out.is_empty() || out.len() > MAX_LEVELS {
            return Err(format!(
                "messageDelayLevel needs 1..={MAX_LEVELS} levels, got {}",
                out.len()
            ));
        }
        Ok(DelayLevels(out))
    }

    pub fn default_levels() -> DelayLevels {
        DelayLevels::parse(DEFAULT_DELAY_LEVELS).expect("the default levels parse")
    }

    /// How many levels (RocketMQ's `maxDelayLevel`).
    pub fn count(&self) -> i32 {
        self.0.len() as i32
    }

    /// The delay of `level` (`1..=count`) in milliseconds.
    pub fn delay_ms(&self, level: i32) -> Option<u64> {
        let i = usize::try_from(level.checked_sub(1)?).ok()?;
        self.0.get(i).copied()
    }

    /// `level` clamped to the table, as RocketMQ does (`> max` becomes `max`).
    pub fn clamp(&self, level: i32) -> i32 {
        level.min(self.count())
    }
}

/// Limits of timed messages (RocketMQ 5's `timerWheelEnable`, `timerMaxDelaySec`).
#[derive(Debug, Clone, Copy)]
pub struct TimerRules {
    pub enabled: bool,
    pub max_delay_ms: i64,
}

/// Why a scheduled message is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `DELAY` is not an integer.
    DelayNotANumber,
    /// A timer property is not an integer (RocketMQ `WHEEL_TIMER_MSG_ILLEGAL`).
    TimerNotANumber,
    /// The delivery time is further ahead than the maximum (`WHEEL_TIMER_MSG_ILLEGAL`).
    TimerTooFar,
    /// Timed messages are switched off (`WHEEL_TIMER_NOT_ENABLE`).
    TimerDisabled,
}

/// What a put does with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Stored where it says.
    Plain,
    /// Stored in [`SCHEDULE_TOPIC`] queue `level - 1` (the level is clamped).
    Delay {
        level: i32,
    },
    /// Stored in [`TIMER_TOPIC`] queue 0, due at `deliver_ms`.
    Timer {
        deliver_ms: i64,
    },
    Refused(Refusal),
}

fn prop<'a>(props: &'a [(String, String)], name: &str) -> Option<&'a str> {
    props
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Whether `props` has a property that could schedule its message ([`admit`]'s cheap
/// exit: a put asks this before it reads the clock).
pub fn may_schedule(props: &[(String, String)]) -> bool {
    props
        .iter()
        .any(|(n, _)| n == DELAY || n.starts_with("TIMER_") || n == START_DELIVER_TIME)
}

/// Decides what a put of a message with `topic`, transaction type `tx_type` (sysflag
/// bits 2-3) and `props` does at `now_ms` (module docs). Scheduling applies to
/// non-transactional and committed messages only, and never to a message already in a
/// schedule topic or carrying `TIMER_OUT_MS` (a delivered timed message put again).
pub fn admit(
    topic: &str,
    tx_type: i32,
    props: &[(String, String)],
    now_ms: i64,
    levels: &DelayLevels,
    timer: TimerRules,
) -> Admission {
    // Cheap exit for the common message: no property that could schedule it.
    if !may_schedule(props) {
        return Admission::Plain;
    }
    if tx_type != 0 && tx_type != super::record::SYSFLAG_TRANSACTION_COMMIT {
        return Admission::Plain;
    }
    if topic == SCHEDULE_TOPIC || topic == TIMER_TOPIC {
        return Admission::Plain;
    }
    if let Some(d) = prop(props, DELAY) {
        let Ok(level) = d.trim().parse::<i32>() else {
            return Admission::Refused(Refusal::DelayNotANumber);
        };
        if level > 0 {
            return Admission::Delay {
                level: levels.clamp(level),
            };
        }
    }
    if prop(props, TIMER_OUT_MS).is_some() {
        return Admission::Plain;
    }
    let relative = |name: &str, unit: i64| {
        prop(props, name).map(|v| {
            v.trim()
                .parse::<i64>()
                .ok()
                .and_then(|n| n.checked_mul(unit))
                .map(|d| now_ms.saturating_add(d))
        })
    };
    let deliver = relative(TIMER_DELAY_SEC, 1000)
        .or_else(|| relative(TIMER_DELAY_MS, 1))
        .or_else(|| prop(props, TIMER_DELIVER_MS).map(|v| v.trim().parse().ok()))
        .or_else(|| prop(props, START_DELIVER_TIME).map(|v| v.trim().parse().ok()));
    match deliver {
        None => Admission::Plain,
        Some(None) => Admission::Refused(Refusal::TimerNotANumber),
        Some(Some(at)) if at <= now_ms => Admission::Plain,
        Some(Some(_)) if !timer.enabled => Admission::Refused(Refusal::TimerDisabled),
        Some(Some(at)) if at - now_ms > timer.max_delay_ms => {
            Admission::Refused(Refusal::TimerTooFar)
        }
        Some(Some(at)) => Admission::Timer { deliver_ms: at },
    }
}

/// Sets property `name` to `value`, replacing it where present (RocketMQ's map put).
pub fn set_property(props: &mut Vec<(String, String)>, name: &str, value: String) {
    match props.iter_mut().find(|(n, _)| n == name) {
        Some((_, v)) => *v = value,
        None => props.push((name.to_string(), value)),
    }
}

/// The ConsumeQueue tagsCode of a record in [`SCHEDULE_TOPIC`] stored at `store_ts`
/// with `DELAY` = `delay` (RocketMQ's `computeDeliverTimestamp`: an unknown level
/// waits 1 s). `None` when `DELAY` is absent or not positive: the tags hash applies.
pub fn schedule_tags_code(store_ts: i64, delay: Option<&str>, levels: &DelayLevels) -> Option<i64> {
    let level: i32 = delay?.trim().parse().ok()?;
    if level <= 0 {
        return None;
    }
    let wait = levels.delay_ms(levels.clamp(level)).unwrap_or(1000);
    Some(store_ts.saturating_add(wait as i64))
}

/// The ConsumeQueue tagsCode of a record in [`TIMER_TOPIC`] stored at `store_ts`: its
/// due time, `max(TIMER_OUT_MS, store_ts)` (a put that waited past its delivery time is
/// due when stored; the timer relies on due times never being below the store
/// timestamp: `crate::timer`). `None` without a valid `TIMER_OUT_MS`.
pub fn timer_tags_code(timer_out: Option<&str>, store_ts: i64) -> Option<i64> {
    let at: i64 = timer_out?.trim().parse().ok()?;
    Some(at.max(store_ts))
}

/// A delivered message's place in its schedule (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub shard: u32,
    pub lane: u32,
    pub hi: u64,
    pub lo: u64,
}

impl Position {
    /// The property value: `shard,lane,hi,lo` in decimal.
    pub fn encode(&self) -> String {
        format!("{},{},{},{}", self.shard, self.lane, self.hi, self.lo)
    }

    pub fn parse(value: &str) -> Option<Position> {
        let mut it = value.split(',');
        let p = Position {
            shard: it.next()?.parse().ok()?,
            lane: it.next()?.parse().ok()?,
            hi: it.next()?.parse().ok()?,
            lo: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(p)
    }

    /// The encoded property (`POSITION` 0x01 value 0x02), to go first in a record's
    /// properties.
    pub fn encode_property(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(POSITION.as_bytes());
        out.push(NAME_VALUE_SEPARATOR);
        out.extend_from_slice(self.encode().as_bytes());
        out.push(PROPERTY_SEPARATOR);
    }

    /// The position a record's encoded properties start with, if any.
    pub fn of_record(props: &[u8]) -> Option<Position> {
        let rest = props.strip_prefix(POSITION.as_bytes())?;
        let rest = rest.strip_prefix(&[NAME_VALUE_SEPARATOR])?;
        let end = rest.iter().position(|b| *b == PROPERTY_SEPARATOR)?;
        Position::parse(std::str::from_utf8(&rest[..end]).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    const RULES: TimerRules = TimerRules {
        enabled: true,
        max_delay_ms: 3 * 86_400_000,
    };

    #[test]
    fn levels_parse_as_rocketmq_and_refuse_nonsense() {
        let l = DelayLevels::default_levels();
        assert_eq!(l.count(), 18);
        assert_eq!(l.delay_ms(1), Some(1000));
        assert_eq!(l.delay_ms(3), Some(10_000));
        assert_eq!(l.delay_ms(18), Some(7_200_000));
        assert_eq!(l.delay_ms(0), None);
        assert_eq!(l.delay_ms(19), None);
        assert_eq!(l.clamp(40), 18);
        let short = DelayLevels::parse("200ms 1s 2d").unwrap();
        assert_eq!(short.delay_ms(1), Some(200));
        assert_eq!(short.delay_ms(3), Some(2 * 86_400_000));
        for bad in ["", "1x", "s", "0s", "-1s", "1.5s", "99999999999999999999d"] {
            assert!(DelayLevels::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn admission_follows_rocketmq_precedence() {
        let l = DelayLevels::default_levels();
        let now = 1_000_000;
        let a = |p: &[(&str, &str)]| admit("T", 0, &props(p), now, &l, RULES);
        assert_eq!(a(&[("TAGS", "x")]), Admission::Plain);
        assert_eq!(a(&[("DELAY", "3")]), Admission::Delay { level: 3 });
        assert_eq!(a(&[("DELAY", "99")]), Admission::Delay { level: 18 });
        assert_eq!(a(&[("DELAY", "0")]), Admission::Plain);
        assert_eq!(
            a(&[("DELAY", "x")]),
            Admission::Refused(Refusal::DelayNotANumber)
        );
        // A delay level wins over timer properties.
        assert_eq!(
            a(&[("TIMER_DELAY_SEC", "5"), ("DELAY", "2")]),
            Admission::Delay { level: 2 }
        );
        // DELAY_SEC, then DELAY_MS, then DELIVER_MS, then __STARTDELIVERTIME.
        assert_eq!(
            a(&[("TIMER_DELIVER_MS", "5000000"), ("TIMER_DELAY_MS", "7")]),
            Admission::Timer {
                deliver_ms: now + 7
            }
        );
        assert_eq!(
            a(&[("TIMER_DELAY_MS", "7"), ("TIMER_DELAY_SEC", "2")]),
            Admission::Timer {
                deliver_ms: now + 2000
            }
        );
        assert_eq!(
            a(&[("__STARTDELIVERTIME", "1000500")]),
            Admission::Timer {
                deliver_ms: 1_000_500
            }
        );
        assert_eq!(a(&[("TIMER_DELIVER_MS", "999")]), Admission::Plain);
        assert_eq!(
            a(&[("TIMER_DELAY_MS", "nope")]),
            Admission::Refused(Refusal::TimerNotANumber)
        );
        assert_eq!(
            a(&[("TIMER_DELAY_SEC", "259201")]),
            Admission::Refused(Refusal::TimerTooFar)
        );
        assert_eq!(
            a(&[("TIMER_DELAY_SEC", "259200")]),
            Admission::Timer {
                deliver_ms: now + 259_200_000
            }
        );
        // Overflow is refused, not wrapped.
        assert_eq!(
            a(&[("TIMER_DELAY_SEC", &i64::MAX.to_string())]),
            Admission::Refused(Refusal::TimerNotANumber)
        );
        // Already scheduled or delivered, or a prepared transaction: plain.
        let p = props(&[("DELAY", "3")]);
        assert_eq!(
            admit(SCHEDULE_TOPIC, 0, &p, now, &l, RULES),
            Admission::Plain
        );
        assert_eq!(admit("T", 4, &p, now, &l, RULES), Admission::Plain);
        assert_eq!(
            admit("T", 8, &p, now, &l, RULES),
            Admission::Delay { level: 3 }
        );
        let p = props(&[("TIMER_OUT_MS", "5"), ("TIMER_DELAY_SEC", "5")]);
        assert_eq!(admit("T", 0, &p, now, &l, RULES), Admission::Plain);
        let off = TimerRules {
            enabled: false,
            ..RULES
        };
        let p = props(&[("TIMER_DELAY_SEC", "5")]);
        assert_eq!(
            admit("T", 0, &p, now, &l, off),
            Admission::Refused(Refusal::TimerDisabled)
        );
    }

    #[test]
    fn tags_codes_are_delivery_times() {
        let l = DelayLevels::default_levels();
        assert_eq!(schedule_tags_code(100, Some("3"), &l), Some(10_100));
        assert_eq!(
            schedule_tags_code(100, Some("40"), &l),
            Some(100 + 7_200_000)
        );
        assert_eq!(schedule_tags_code(100, Some("0"), &l), None);
        assert_eq!(schedule_tags_code(100, None, &l), None);
        assert_eq!(timer_tags_code(Some("123"), 100), Some(123));
        assert_eq!(
            timer_tags_code(Some("123"), 500),
            Some(500),
            "due when stored"
        );
        assert_eq!(timer_tags_code(Some("x"), 100), None);
        assert_eq!(timer_tags_code(None, 100), None);
    }

    #[test]
    fn positions_round_trip_and_are_found_only_first() {
        let p = Position {
            shard: 2,
            lane: 3,
            hi: 17,
            lo: 0,
        };
        assert_eq!(Position::parse(&p.encode()), Some(p));
        let mut bytes = Vec::new();
        p.encode_property(&mut bytes);
        bytes.extend_from_slice(b"TAGS\x01a\x02");
        assert_eq!(Position::of_record(&bytes), Some(p));
        let mut later = b"TAGS\x01a\x02".to_vec();
        p.encode_property(&mut later);
        assert_eq!(Position::of_record(&later), None);
        for bad in ["", "1,2,3", "1,2,3,4,5", "a,2,3,4", "-1,2,3,4"] {
            assert_eq!(Position::parse(bad), None, "{bad:?}");
        }
    }
}
